"""What an adaptive comparison's decisions rest on, fixed when its test begins.

AdaStop spends its error budget over the stages and pairs it was set up with: a resume that changed
``adaptive.max_stages`` would re-spend every stage's budget, including stages already read, and one
that changed the arms, ``alpha``, the pairs or the seeds would replay other decisions than those made.
So the settings and the arm list are written to ``<output_dir>/<name>/adaptive-test.json`` when the
test begins, and a resume that differs is refused in one line naming the field. ``--new-test`` is the
way to go on with other settings over the same runs: it says that it starts a new test, and keeps the
earlier record beside it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from exgrpo.atomic import write_text_atomic
from exgrpo.config import CompareConfig, ConfigError

RECORD_FILE = "adaptive-test.json"
_KEPT = re.compile(r"adaptive-test\.(\d+)\.json")

TEST = "adastop-0.1.3+joint-permutations"
"""Which sequential test made the decisions (:mod:`exgrpo.compare.joint_permutation`): a record of another
(AdaStop's per-pair permutations, before it) is not resumed."""

FIELDS = ("test", "arms", "baseline", "metric", "adaptive.seeds_per_stage", "adaptive.max_stages", "adaptive.alpha",
          "adaptive.pairs", "adaptive.first_seed", "adaptive.permutations", "adaptive.test_seed")
"""What the decisions rest on: each is compared on a resume, in this order."""


def settings_of(cc: CompareConfig) -> dict[str, Any]:
    """The settings of ``cc``'s sequential test, named as the config names them (``adaptive.first_seed``
    resolved: the file's first seed where it is null)."""
    a = cc.adaptive
    return {"test": TEST, "arms": list(cc.arms), "baseline": cc.baseline, "metric": cc.metric,
            "adaptive.seeds_per_stage": a.seeds_per_stage, "adaptive.max_stages": a.max_stages,
            "adaptive.alpha": a.alpha, "adaptive.pairs": a.pairs,
            "adaptive.first_seed": a.first_seed if a.first_seed is not None else cc.seeds[0],
            "adaptive.permutations": a.permutations, "adaptive.test_seed": a.test_seed}


def changes(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``field: was -> now`` for each field of :data:`FIELDS` whose value differs."""
    def shown(x: Any) -> str:
        return ",".join(map(str, x)) if isinstance(x, list) else str(x)

    return [f"{f}: {shown(recorded.get(f))} -> {shown(now[f])}" for f in FIELDS if recorded.get(f) != now[f]]


def record_path(cc: CompareConfig) -> Path:
    base = cc.base_config()
    return Path(base.output_dir).resolve() / base.name / RECORD_FILE


def check_settings(cc: CompareConfig, resume: bool, new_test: bool) -> None:
    """Before any work: ConfigError, one line, when a resume would change a recorded test's settings
    (without ``new_test``); ``new_test`` without ``resume`` is refused too (a comparison that is not
    resumed starts a new test anyway)."""
    if new_test and not resume:
        raise ConfigError("--new-test goes with --resume --adaptive: it starts a new sequential test over a "
                          "comparison's runs; without --resume every run trains again and the test is new anyway")
    path = record_path(cc)
    if not resume or new_test or not path.is_file():
        return
    recorded = json.loads(path.read_text())["settings"]
    diff = changes(recorded, settings_of(cc))
    if diff and diff[0].startswith("test: "):
        began = recorded.get("test") or "AdaStop with per-pair permutations"
        raise ConfigError(f"this adaptive test began under another sequential test ({began}; now {TEST}) ({path}): "
                          "add --new-test to start a new test over these runs (docs/seeds.md)")
    if diff:
        field, _, values = diff[0].partition(": ")
        was, _, now = values.partition(" -> ")
        flag = "--arms" if field == "arms" else f"--set {field}"
        more = f" (and {len(diff) - 1} more: {'; '.join(diff[1:])})" if len(diff) > 1 else ""
        raise ConfigError(f"{field}={now} differs from {was}, which this adaptive test began with ({path}){more}: "
                          f"a resume keeps the settings its decisions were made under; drop {flag}, or add "
                          "--new-test to start a new test over these runs (docs/seeds.md)")


def _next_kept(path: Path) -> Path:
    """``adaptive-test.<n>.json`` beside ``path``, numbered past the largest number there: records kept
    earlier may have been deleted, so their count could name one that still exists."""
    numbers = [int(m.group(1)) for p in path.parent.iterdir() if (m := _KEPT.fullmatch(p.name))]
    return path.with_name(f"adaptive-test.{max(numbers, default=0) + 1}.json")


def begin(cc: CompareConfig, resume: bool, new_test: bool) -> str | None:
    """Record the test's settings where they are not recorded yet, or anew (a comparison not resumed, or
    ``new_test``: the earlier record is kept as ``adaptive-test.<n>.json``); -> a note for the user when a
    new test replaces a recorded one, else None. Call after :func:`check_settings`."""
    path = record_path(cc)
    now = settings_of(cc)
    note = None
    if path.is_file():
        recorded = json.loads(path.read_text())["settings"]
        if resume and not new_test:
            return None
        diff = changes(recorded, now)
        if new_test or diff:
            kept = _next_kept(path)
            write_text_atomic(kept, path.read_text())  # the record stays under its own name until replaced below
            note = (f"a new sequential test{' (' + '; '.join(diff) + ')' if diff else ''}: its error rate holds for "
                    f"its own decisions, from its stage 1, not for the earlier test's, whose record is {kept}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"settings": now}, indent=1) + "\n")
    return note
