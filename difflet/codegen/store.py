"""The content-addressed store: compiled programs (and random checkpoints) keyed by a hex key.

Invariants:
- An entry is visible only once complete: it is written under a temporary name in the same
  directory and renamed into place (rename is atomic on one filesystem).
- Concurrent producers of the same key serialize on a per-key file lock, and the second one
  finds the entry and does not produce it again: a key is compiled once.
- The store never decides what a key means; callers pass keys that cover everything that
  determines the entry (the component's cache_key; checkpoint configs + seed).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from difflet.errors import DiffletError


def default_store_dir() -> Path:
    """`$DIFFLET_STORE`, else `$XDG_CACHE_HOME/difflet/store`, else `~/.cache/difflet/store`."""
    if os.environ.get("DIFFLET_STORE"):
        return Path(os.environ["DIFFLET_STORE"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "difflet" / "store"


def _check_key(key: str) -> str:
    if not key or not all(c in "0123456789abcdef" for c in key.lower()):
        raise DiffletError(f"store keys are hex strings, got {key!r}", where="cache_key")
    return key.lower()


class Store:
    """A directory of entries `<root>/<kind>/<key[:2]>/<key>` (a file or a directory)."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root is not None else default_store_dir()

    def path(self, kind: str, key: str, suffix: str = "") -> Path:
        key = _check_key(key)
        return self.root / kind / key[:2] / f"{key}{suffix}"

    def has(self, kind: str, key: str, suffix: str = "") -> bool:
        return self.path(kind, key, suffix).exists()

    @contextlib.contextmanager
    def lock(self, kind: str, key: str) -> Iterator[None]:
        """Hold an exclusive lock on one key (blocks while another process holds it)."""
        target = self.path(kind, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def get_or_create(self, kind: str, key: str, produce: Callable[[Path], None],
                      suffix: str = "", directory: bool = False) -> tuple[Path, bool]:
        """Return `(path, created)`. `produce(tmp)` writes the entry at `tmp`; it runs at most once per key.

        If `produce` raises, nothing is published and the temporary is removed.
        """
        final = self.path(kind, key, suffix)
        if final.exists():
            return final, False
        with self.lock(kind, key):
            if final.exists():  # another process finished it while we waited
                return final, False
            tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
            tmp = tmp_dir / ("entry" + suffix)
            try:
                if directory:
                    tmp.mkdir()
                produce(tmp)
                if not tmp.exists():
                    raise RuntimeError(f"store producer wrote nothing for {kind}/{key}")
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp_dir, ignore_errors=True)
        return final, True


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link `src` to `dst` (same filesystem), else copy; replaces `dst` atomically."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    if tmp.exists():
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)
