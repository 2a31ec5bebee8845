"""The configuration reference page of the docs site, generated from the typed config.

Names, defaults and docstrings come from :func:`exgrpo.config.field_docs`, the extractor behind
``exgrpo train --help`` and ``exgrpo config``; resume safety from
:func:`exgrpo.config.resume_safe_fields`. A union section (task, policy, algorithm) is read one
member at a time, so each variant shows its own defaults and every row says which variants have the
field. This module adds only what those two leave out: the field's type and bounds.

    python -m exgrpo.config.reference            # print the page
    python -m exgrpo.config.reference --write    # write docs/reference/configuration.md

``tests/test_config_reference.py`` fails when the committed page differs from :func:`reference_page`.
"""

from __future__ import annotations

import argparse
import enum
import html
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, NamedTuple

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from exgrpo.config.experiment import _TIER_KINDS, CompareConfig, ExperimentConfig
from exgrpo.config.fields import _tag_field, _union_members, field_docs, resume_safe_fields

PAGE = Path("docs/reference/configuration.md")
"""Where ``--write`` puts the page (relative to the repository root)."""

_VERL_REPLAYS = "none, buckets, uniform"
"""algorithm.replay values the veRL backend runs (exgrpo/config/backend.py: check_verl_support)."""


class Row(NamedTuple):
    name: str
    type: str
    default: str
    resume_safe: bool
    applies_to: str
    doc: str


def _field(model: type[BaseModel], dotted: str) -> FieldInfo:
    """The FieldInfo of a dotted leaf field below ``model`` (nested sections have one member)."""
    head, _, rest = dotted.partition(".")
    f = model.model_fields[head]
    return _field(_union_members(f.annotation)[0], rest) if rest else f


def _type_name(annotation: Any, inner: bool = False) -> str:
    """A reader's name for a field type: the values of an enum or Literal, ``or null`` for Optional,
    ``list of X`` for a list or a variable-length tuple (both are YAML lists)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    values = None
    if origin is Literal:
        values = [str(getattr(a, "value", a)) for a in args]
    elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [str(m.value) for m in annotation]
    if values is not None:
        return f"({', '.join(values)})" if inner else "one of " + ", ".join(values)
    if origin in (typing.Union, types.UnionType):
        named = [_type_name(a, inner) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if len(named) < len(args) else "")
    if origin in (list, tuple) and (origin is list or args[-1] is Ellipsis):
        return f"list of {_type_name(args[0], inner=True)}"
    if origin is dict:
        return f"mapping of {_type_name(args[0], inner=True)} to {_type_name(args[1], inner=True)}"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(f: FieldInfo) -> str:
    """``ge=1, le=6`` -> ``≥ 1, ≤ 6``."""
    marks = {annotated_types.Ge: ("ge", "≥"), annotated_types.Gt: ("gt", ">"),
             annotated_types.Le: ("le", "≤"), annotated_types.Lt: ("lt", "<")}
    return ", ".join(f"{sign} {getattr(m, attr)}" for m in f.metadata
                     for cls, (attr, sign) in marks.items() if isinstance(m, cls))


def _type_of(model: type[BaseModel], dotted: str) -> str:
    f = _field(model, dotted)
    bounds = _bounds(f)
    return _type_name(f.annotation) + (f", {bounds}" if bounds else "")


def _tag_of(member: type[BaseModel], tag: str) -> str:
    value = member.model_fields[tag].default
    return str(getattr(value, "value", value))


def _variant_label(section: str, tag_value: str) -> str:
    """``lm`` -> ``lm`` (tiny-lm): a task or policy kind with the tier that selects it by default."""
    slot = {"task": 0, "policy": 1}.get(section)
    tiers = [t for t, kinds in _TIER_KINDS.items() if slot is not None and kinds[slot] == tag_value]
    return f"`{tag_value}`" + (f" ({', '.join(tiers)})" if tiers else "")


def _default_of(model: type[BaseModel], dotted: str, shown: str) -> str:
    """field_docs' default, or ``required`` for a field without one."""
    return "required" if _field(model, dotted).is_required() else shown


def section_rows(section: str) -> list[Row]:
    """The rows of one top-level section of :class:`ExperimentConfig` (``task``, ``train``, ...)."""
    f = ExperimentConfig.model_fields[section]
    members = _union_members(f.annotation)
    safe = resume_safe_fields()
    prefix = f"{section}."
    if len(members) == 1:
        return [
            Row(name, _type_of(members[0], name[len(prefix):]), default, name in safe,
                "`backend.name` = `verl`" if name.startswith("backend.verl.") else "all", doc)
            for name, default, doc in field_docs(members[0], prefix)
        ]
    tag = _tag_field(members)
    default_member = type(f.get_default(call_default_factory=True))
    members = sorted(members, key=lambda m: m is not default_member)  # the order field_docs uses
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    order: dict[str, int] = {}
    for m in members:
        for name, default, doc in field_docs(m, prefix):
            if name == prefix + tag:
                continue
            order.setdefault(name, len(order))
            key = (name, _type_of(m, name[len(prefix):]), default, doc)  # a variant's own default: its own row
            grouped.setdefault(key, []).append(_tag_of(m, tag))
    tags = [_tag_of(m, tag) for m in members]
    rows = [Row(prefix + tag, "one of " + ", ".join(tags), f'"{tags[0]}"', prefix + tag in safe,
                "all", f"{' '.join((f.description or '').split())} Chooses the variant.")]
    for (name, type_, default, doc), have in sorted(grouped.items(), key=lambda kv: order[kv[0][0]]):
        applies = "all" if len(have) == len(members) else \
            f"`{prefix}{tag}` = " + ", ".join(_variant_label(section, h) for h in have)
        rows.append(Row(name, type_, default, name in safe, applies, doc))
    return rows


def field_name(dotted: str) -> str:
    """A field's name as table code that wraps only after a dot (``<wbr>``): a narrow column breaks
    ``task.data_seed`` as ``task.`` / ``data_seed``, never inside a name (docs/stylesheets/extra.css)."""
    return "<code>" + ".<wbr>".join(html.escape(part) for part in dotted.split(".")) + "</code>"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


_DOCS_PAGE = re.compile(r"(?<![\w/])docs/([\w/-]+\.md(?:#[\w-]+)?)")
"""A docstring's ``docs/<page>.md``: a path in the terminal (``--help``), a checked link on this page."""


def _doc(text: str) -> str:
    """A docstring as a table cell or list item, its ``docs/`` pages linked (mkdocs --strict checks them)."""
    up = os.path.relpath("docs", PAGE.parent)
    return _DOCS_PAGE.sub(lambda m: f"[docs/{m[1]}]({up}/{m[1]})", _cell(text))


def _table(rows: list[Row], run_config: bool = True) -> list[str]:
    """A Markdown table; a comparison file's fields (``run_config=False``) have no variants and no resume."""
    if not run_config:
        out = ["| field | type | default | description |", "|---|---|---|---|"]
        return out + [f"| {field_name(r.name)} | {_cell(r.type)} | {_default(r.default)} | {_doc(r.doc)} |" for r in rows]
    out = ["| field | type | default | resume-safe | applies to | description |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {field_name(r.name)} | {_cell(r.type)} | {_default(r.default)} | {'yes' if r.resume_safe else ''} "
                   f"| {_cell(r.applies_to)} | {_doc(r.doc)} |")
    return out


def _default(value: str) -> str:
    """A default as table code that wraps only at its spaces: each space-free run is kept whole, so a
    narrow column never breaks ``"toy-exgrpo"`` at its hyphen (docs/stylesheets/extra.css)."""
    if value == "required":
        return value
    runs = " ".join(f"<span>{_literal(run)}</span>" for run in value.split())
    return f'<code class="default">{runs}</code>'


_MARKDOWN = {c: f"&#{ord(c)};" for c in "\\`*[]|"}
"""Characters Markdown would read inside inline HTML (escapes, code, emphasis, links, a table's cell
separator), written as entities so the code shows exactly the default's JSON."""


def _literal(text: str) -> str:
    return "".join(_MARKDOWN.get(c, c) for c in html.escape(text, quote=False))


def _variants(section: str) -> list[str]:
    f = ExperimentConfig.model_fields[section]
    members = _union_members(f.annotation)
    if len(members) == 1:
        return [_doc(members[0].__doc__ or "")]
    tag = _tag_field(members)
    lines = [f"Variants, chosen by `{section}.{tag}`:", ""]
    for m in members:
        lines.append(f"- {_variant_label(section, _tag_of(m, tag))}: {_doc(m.__doc__ or '')}")
    return lines


_INTRO = f"""\
# Configuration reference

<!-- Generated by `python -m exgrpo.config.reference --write` from the typed config in exgrpo/config/.
     Edit the field docstrings there, not this page: tests/test_config_reference.py fails when they differ. -->

A run is one experiment config: a YAML file in `experiments/` plus `--set field=value` overrides,
validated before any work starts (an unknown field, a bad value or a field of another variant is an
error that names it). `exgrpo config FILE` prints a resolved config; `exgrpo train --help` lists
these fields in the terminal.

- **default**: the value when neither the file nor `--set` gives one (JSON; `null` is YAML's `null`).
  The `tier` fills in `task.kind` and `policy.kind` when they are absent.
- **resume-safe**: `--resume` accepts a run whose saved config differs from the current one only in
  these fields (the budget, the cadence of evaluation and checkpoints, where things are written and
  run, and settings that compute the same thing up to float rounding); any other difference is an
  error naming the fields (`--force-resume` overrides it).
- **applies to**: `task`, `policy` and `algorithm` have one variant per `kind` (or per `replay`),
  each with only the fields it reads; a row says which variants have the field (`all`: every
  variant), and a variant's own default gets its own row. A task or policy kind is followed by the
  tier that selects it. The `backend.verl` settings are read when `backend.name` is `verl`, which
  runs `algorithm.replay` {_VERL_REPLAYS}.
"""

_COMPARE_INTRO = """\
## Comparison files

A comparison (`exgrpo compare`, e.g. `experiments/toy.yaml`) holds a `base` experiment config and
named `arms` of dotted overrides; every arm runs every seed. An algorithm field in `base` applies to
the arms whose algorithm has it, and is an error if no arm's algorithm has it.
"""


def reference_page() -> str:
    """The Markdown page: every field of :class:`ExperimentConfig`, section by section, and of
    :class:`CompareConfig`."""
    lines = [_INTRO]
    top = [n for n, f in ExperimentConfig.model_fields.items() if not _union_members(f.annotation)]
    safe = resume_safe_fields()
    rows = [Row(n, _type_of(ExperimentConfig, n), d, n in safe, "all", doc)
            for n, d, doc in field_docs(ExperimentConfig) if n in top]
    lines += ["## Top level", "", _doc(ExperimentConfig.__doc__ or ""), "", *_table(rows), ""]
    for section in (n for n in ExperimentConfig.model_fields if n not in top):
        lines += [f"## {section}", "", *_variants(section), "", *_table(section_rows(section)), ""]
    compare = [Row(n, _type_of(CompareConfig, n), _default_of(CompareConfig, n, d), False, "", doc)
               for n, d, doc in field_docs(CompareConfig)]
    lines += [_COMPARE_INTRO, *_table(compare, run_config=False)]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.config.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {PAGE} (from the repository root) instead of printing")
    args = parser.parse_args(argv)
    page = reference_page()
    if args.write:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(page)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
