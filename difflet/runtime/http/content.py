"""Generated files kept for the HTTP API (video content, image `url` replies): a directory of
files, each kept `retention_s` after it was written and all together at most `max_bytes`.

Invariants:
- `put` makes room by deleting the oldest files first; a file larger than the whole bound is
  refused (ValueError naming both sizes), never stored past the bound.
- Expired files are deleted by a sweeper thread that waits for the next expiry (no polling);
  `get` never returns an expired file. `close` deletes the directory.
- `on_evict(name)` is told of every file removed by expiry or room-making (not by `remove`).
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable


class ContentStore:
    def __init__(self, retention_s: float, max_bytes: int,
                 on_evict: Callable[[str], None] = lambda name: None) -> None:
        self.retention_s, self.max_bytes, self.on_evict = retention_s, max_bytes, on_evict
        self.root = Path(tempfile.mkdtemp(prefix="difflet-content-"))
        self._files: OrderedDict[str, tuple[int, float]] = OrderedDict()  # name -> (bytes, expiry)
        self._used = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
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

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        shutil.rmtree(self.root, ignore_errors=True)

    def _drop(self, name: str) -> str:  # lock held
        size, _ = self._files.pop(name)
        self._used -= size
        (self.root / name).unlink(missing_ok=True)
        return name

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
