"""The configuration reference page (docs/reference/configuration.md) is generated from the typed
config; a field added or changed without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

from exgrpo.config import config_fields
from exgrpo.config.reference import PAGE, field_name, reference_page

ROOT = Path(__file__).resolve().parent.parent


def test_committed_page_is_what_the_generator_writes():
    committed = (ROOT / PAGE).read_text()
    assert committed == reference_page(), (
        f"{PAGE} is out of date with exgrpo/config/; regenerate it with "
        "`python -m exgrpo.config.reference --write` and commit the result"
    )


def test_every_config_field_has_a_row():
    page = reference_page()
    missing = [name for name in config_fields() if f"| {field_name(name)} |" not in page]
    assert not missing, f"fields without a row in the reference page: {missing}"
