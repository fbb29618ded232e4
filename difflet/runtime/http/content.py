"""Generated files kept for the HTTP API (video content, image `url` replies): a directory of
files, each kept `retention_s` after it was written and all together at most `max_bytes`.

Invariants:
- `put` makes room by deleting the oldest files first; a file larger than the whole bound is
  refused (ValueError naming both sizes), never stored past the bound.
- Expired files are deleted by a sweeper thread that waits for the next expiry (no polling);
  `get` never returns an expired file. `close` deletes the directory.
- `on_evict(name)` is told of every file removed by expiry or room-making (not by `remove`).
- With a state dir (`state_dir`, see jobstore.py) the files live in DIR/content and each is
  indexed in the job store (`state`) after it is written and before it is deleted, so a restart
  finds them: files past their expiry, files with no index row (a write the process did not
  live to index) and rows with no file are removed at startup, and the rest are kept until
  their expiry, at most the current retention from now. `close` then keeps the files and
  releases the state dir. Without one, a temporary directory that `close` deletes.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from difflet.runtime.http.jobstore import JobRecords, JobStore


def owned(owner: str, name: str) -> str:
    """The stored name of an owner's file (auth.Keys: the owner is its key's tag, "" without keys)."""
    return f"{owner}-{name}" if owner else name


class ContentStore:
    def __init__(self, retention_s: float, max_bytes: int,
                 on_evict: Callable[[str], None] = lambda name: None, state_dir: str | None = None) -> None:
        self.retention_s, self.max_bytes, self.on_evict = retention_s, max_bytes, on_evict
        self.state: JobRecords | None = JobStore.open(state_dir) if state_dir else None
        self.root = self.state.content_dir if self.state else Path(tempfile.mkdtemp(prefix="difflet-content-"))
        self._files: OrderedDict[str, tuple[int, float]] = OrderedDict()  # name -> (bytes, expiry)
        self._used = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        if self.state:
            self._restore()
        threading.Thread(target=self._sweep, name="content-sweeper", daemon=True).start()

    def put(self, name: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            raise ValueError(f"the file is {len(data)} bytes, more than the content store's bound "
                             f"of {self.max_bytes} bytes (--http-content-mb)")
        evicted = []
        with self._lock:
            while self._used + len(data) > self.max_bytes and self._files:
                evicted.append(self._drop(next(iter(self._files))))
            try:
                (self.root / name).write_bytes(data)
            except OSError:  # a full disk (ENOSPC): no partial file stays behind
                (self.root / name).unlink(missing_ok=True)
                raise
            self._files[name] = (len(data), time.monotonic() + self.retention_s)
            self._used += len(data)
            if self.state:
                self.state.put_content(name, len(data), time.time() + self.retention_s)
        self._wake.set()
        for old in evicted:
            self.on_evict(old)

    def get(self, name: str) -> bytes | None:
        with self._lock:
            entry = self._files.get(name)
            if entry is None or entry[1] <= time.monotonic():
                return None
            return (self.root / name).read_bytes()

    def remove(self, name: str) -> None:
        with self._lock:
            if name in self._files:
                self._drop(name)

    def used_bytes(self) -> int:
        return self._used

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._files

    def names(self) -> list[str]:
        with self._lock:
            return list(self._files)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self.state:  # the files stay for the next start; the state dir is released
            self.state.close()
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def _drop(self, name: str) -> str:  # lock held
        size, _ = self._files.pop(name)
        self._used -= size
        if self.state:  # unindexed before it goes: a crash between the two leaves an orphan file
            self.state.drop_content([name])
        (self.root / name).unlink(missing_ok=True)
        return name

    def _restore(self) -> None:
        """Index the files a previous process kept (see the invariants); before any thread runs."""
        now, mono = time.time(), time.monotonic()
        on_disk = {p.name: p for p in self.root.iterdir()}
        stale = []
        for name, size, expires in self.state.contents():  # soonest expiry first: _files' order
            path = on_disk.pop(name, None)
            if path is None or expires <= now or not path.is_file() or path.stat().st_size != size:
                stale.append(name)
                if path is not None and path.is_file():
                    path.unlink()
                continue
            self._files[name] = (size, mono + min(expires - now, self.retention_s))
            self._used += size
        self.state.drop_content(stale)
        for path in on_disk.values():  # no index row: never finished, or a stranger's
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        while self._used > self.max_bytes:  # a smaller --http-content-mb than before
            self._drop(next(iter(self._files)))

    def _sweep(self) -> None:
        while not self._closed:
            now = time.monotonic()
            with self._lock:
                expired = [n for n, (_, exp) in self._files.items() if exp <= now]
                for name in expired:
                    self._drop(name)
                # files are put in time order with one retention, so the first expires next
                nxt = next(iter(self._files.values()))[1] if self._files else None
            for name in expired:
                self.on_evict(name)
            self._wake.wait(None if nxt is None else max(0.0, nxt - time.monotonic()))
            self._wake.clear()
