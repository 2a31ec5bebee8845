"""What traces an MLflow run to the code that produced it: the package version and the git commit."""

from __future__ import annotations

import functools
from pathlib import Path

from exgrpo import __version__


@functools.cache
def code_version_tags() -> dict[str, str]:
    """``exgrpo_version`` and, in a git checkout of the project, ``git_commit`` (with ``-dirty`` when
    tracked files differ from it): what traces a result to the code that produced it."""
    import subprocess

    tags = {"exgrpo_version": __version__}
    src = Path(__file__).resolve().parents[2]  # the checkout holding exgrpo/
    if (src / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            tags["git_commit"] = head + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):  # no git binary, or not a checkout after all
            pass
    return tags
