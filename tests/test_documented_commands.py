"""Every ``exgrpo train`` and ``exgrpo compare`` command that docs/your-model-and-data.md and README.md
give resolves to a config as the command itself resolves it before any work: its flags read by the
command's own parser, its file with the ``--set`` overrides, the cross-field checks, and for a train
command whose files exist, the checks of the local inputs. Files a command names as the reader's own
(``/models/my-qwen2``, ``data/train.parquet``, ``my-comparison.yaml``) stand for files this checkout
does not have: their configs are checked, not the files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from exgrpo.cli import _run_config, build_parser
from exgrpo.config import load_compare, parse_set
from exgrpo.policies.inputs import check_inputs

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/your-model-and-data.md", "README.md")
READERS_OWN = ("/models/", "data/train", "data/val", "my/", "my-")
"""How the pages name a reader's own files."""


def documented_commands(page: str) -> list[str]:
    """The ``exgrpo train``/``compare`` commands of ``page``'s bash blocks, continuation lines joined,
    comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith(("exgrpo train ", "exgrpo compare ")):
                commands.append(line)
    return commands


COMMANDS = [(page, command) for page in PAGES for command in documented_commands(page)]


def test_the_pages_give_the_commands_this_test_checks():
    """The extraction finds the pages' commands (an empty list would pass every check below)."""
    mine = dict.fromkeys(c for p, c in COMMANDS if p == "docs/your-model-and-data.md")
    assert "exgrpo train experiments/smollm2-file.yaml --set backend.name=verl" in mine
    assert any(c.startswith("exgrpo train experiments/smollm2-file.yaml --set policy.path=") for c in mine)
    assert any(p == "README.md" and c.startswith("exgrpo compare experiments/toy.yaml") for p, c in COMMANDS)


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{Path(p).stem}: {c[7:70]}" for p, c in COMMANDS])
def test_a_documented_command_resolves_to_a_valid_config(page, command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    args = build_parser().parse_args(shlex.split(command)[1:])
    if not Path(args.config).is_file():
        assert args.config.startswith(READERS_OWN), f"{page}: {command}: {args.config} is not in the checkout"
        return
    overrides = parse_set(args.set)
    if args.command == "compare":
        cc = load_compare(args.config, overrides).select(args.arms, None if args.adaptive else args.seeds)
        assert cc.arms
        return
    for flag, field in (("seed", "seed"), ("max_steps", "train.max_steps"), ("output_dir", "output_dir")):
        if getattr(args, flag) is not None:
            overrides[field] = getattr(args, flag)
    cfg = _run_config(args.config, overrides, args.arm)  # what `exgrpo train` and `exgrpo config` resolve
    if not any(str(v).startswith(READERS_OWN) for v in overrides.values()):
        check_inputs(cfg)  # the files it names are this checkout's: checked as the run checks them
