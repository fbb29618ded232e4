"""The server state directory of the HTTP API (`difflet-runtime --state-dir DIR`): an embedded
SQLite job store (`DIR/jobs.sqlite3`), the kept files (`DIR/content/`) and a lock (`DIR/lock`).

Invariants:
- One API process per state dir: `JobStore.open` takes an exclusive `flock` on `DIR/lock` for
  the process's life (the kernel drops it when the process dies, `kill -9` included); a second
  process is refused with a DiffletError naming the holder's pid, never let in to corrupt it.
- Every write is committed before the call returns (WAL, synchronous=NORMAL: durable when the
  process is killed; a power cut may lose the last commits). One connection, one lock: callers
  are any threads.
- A failed write (disk full, I/O error) is logged and skipped: the job goes on, only its record
  is stale; the front never fails a request because its bookkeeping could not be saved.
- Times in the store are wall-clock seconds (time.time()), so they mean the same after a restart.
- Torch-free (stdlib sqlite3 and fcntl only).
"""
from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Protocol

from difflet.errors import DiffletError

log = logging.getLogger("difflet.runtime")
SCHEMA_VERSION = 2  # 2: videos.owner
VIDEO_COLUMNS = ("id", "owner", "request", "model", "size", "frames", "fps", "status", "progress", "error",
                 "created_at", "completed_at", "deadline", "expires")
SCHEMA = """
CREATE TABLE IF NOT EXISTS videos (
    n INTEGER PRIMARY KEY AUTOINCREMENT,  -- admission order: queued jobs are resubmitted in it
    id TEXT UNIQUE NOT NULL,
    owner TEXT NOT NULL DEFAULT '',       -- the API key's tag (auth.Keys): only its holders see the job
    request TEXT NOT NULL,                -- the admitted Request as msgspec JSON
    model TEXT NOT NULL, size TEXT NOT NULL, frames INTEGER NOT NULL, fps REAL NOT NULL,
    status TEXT NOT NULL,                 -- queued | in_progress | completed | failed
    progress INTEGER NOT NULL, error TEXT,  -- error: the OpenAI-style {code, message} as JSON
    created_at INTEGER NOT NULL, completed_at INTEGER,
    deadline REAL,                        -- wall-clock deadline of the job, if it has one
    expires REAL                          -- wall-clock time an ended record is dropped
);
CREATE TABLE IF NOT EXISTS content (name TEXT PRIMARY KEY, bytes INTEGER NOT NULL, expires REAL NOT NULL);
"""


def default_state_dir() -> Path:
    """$XDG_STATE_HOME/difflet, else ~/.local/state/difflet (the XDG base directory spec's
    place for state that should survive a restart but is not worth backing up)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "difflet"


class JobRecords(Protocol):
    """What VideoJobs and ContentStore ask of a job store: the interface a shared store (Redis,
    for several API processes) implements beside JobStore. Rows are dicts of VIDEO_COLUMNS;
    every write is durable when the call returns; `videos()` is in admission order."""

    content_dir: Path

    def add_video(self, **row: Any) -> None: ...
    def set_video(self, video_id: str, **changes: Any) -> None: ...
    def drop_videos(self, ids: list[str]) -> None: ...
    def videos(self) -> list[dict[str, Any]]: ...
    def put_content(self, name: str, size: int, expires: float) -> None: ...
    def drop_content(self, names: list[str]) -> None: ...
    def contents(self) -> list[tuple[str, int, float]]: ...
    def close(self) -> None: ...


class JobStore:
    """The state dir's lock and database (JobRecords over SQLite); `content_dir` holds the
    ContentStore's files."""

    def __init__(self, root: Path, lock_fd: int, db: sqlite3.Connection) -> None:
        self.root, self.content_dir = root, root / "content"
        self._lock_fd, self._db = lock_fd, db
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, state_dir: str | os.PathLike) -> JobStore:
        """Create (mode 0700) and lock DIR, open its database; DiffletError(where="--state-dir")
        if DIR cannot be made, is in use by another process, or holds a database not ours."""
        root = Path(state_dir).expanduser().absolute()
        try:
            (root / "content").mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise DiffletError(f"{root}: cannot use it as the state directory ({err.strerror})",
                               where="--state-dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DiffletError(f"{root} is in use by another difflet-runtime (pid {holder}); give "
                               f"each server its own --state-dir", where="--state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            return cls(root, fd, _connect(root / "jobs.sqlite3"))
        except BaseException:
            os.close(fd)  # releases the lock
            raise

    # ---- video jobs
    def add_video(self, **row: Any) -> None:
        cols = [c for c in VIDEO_COLUMNS if c in row]
        self._write(f"INSERT OR REPLACE INTO videos ({', '.join(cols)}) VALUES "
                    f"({', '.join('?' * len(cols))})", [row[c] for c in cols])

    def set_video(self, video_id: str, **changes: Any) -> None:
        cols = [c for c in VIDEO_COLUMNS[3:] if c in changes]
        assert len(cols) == len(changes), changes  # only known columns: names go into the SQL text
        self._write(f"UPDATE videos SET {', '.join(c + ' = ?' for c in cols)} WHERE id = ?",
                    [changes[c] for c in cols] + [video_id])

    def drop_videos(self, ids: list[str]) -> None:
        if ids:
            self._write("DELETE FROM videos WHERE id = ?", [(i,) for i in ids], many=True)

    def videos(self) -> list[dict[str, Any]]:
        """Every video row as a dict, in admission order."""
        with self._lock:
            cur = self._db.execute(f"SELECT {', '.join(VIDEO_COLUMNS)} FROM videos ORDER BY n")
            return [dict(zip(VIDEO_COLUMNS, row)) for row in cur.fetchall()]

    # ---- kept files (their bytes live in content_dir)
    def put_content(self, name: str, size: int, expires: float) -> None:
        self._write("INSERT OR REPLACE INTO content (name, bytes, expires) VALUES (?, ?, ?)",
                    [name, size, expires])

    def drop_content(self, names: list[str]) -> None:
        if names:
            self._write("DELETE FROM content WHERE name = ?", [(n,) for n in names], many=True)

    def contents(self) -> list[tuple[str, int, float]]:
        """(name, bytes, wall-clock expiry) of every kept file, soonest expiry first."""
        with self._lock:
            return self._db.execute("SELECT name, bytes, expires FROM content ORDER BY expires").fetchall()

    def close(self) -> None:
        """Close the database and release the lock; later writes are no-ops."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._db.close()
            os.close(self._lock_fd)

    def _write(self, sql: str, args, many: bool = False) -> None:
        with self._lock:
            if self._closed:  # a watcher ending after shutdown: nothing left to record into
                return
            try:
                with self._db:  # one transaction, committed on leaving
                    (self._db.executemany if many else self._db.execute)(sql, args)
            except sqlite3.Error as err:
                log.error("job store %s: %s (the record is not saved)", self.root, err)


def _connect(path: Path) -> sqlite3.Connection:
    """The database at `path`, in WAL mode, with the current schema; DiffletError if the file
    is not a job store of this version."""
    try:
        db = sqlite3.connect(path, check_same_thread=False, timeout=30)
    except sqlite3.Error as err:
        raise DiffletError(f"{path}: cannot open the job store ({err})", where="--state-dir") from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 1:  # before owners: its jobs belong to the keyless owner ""
            db.execute("ALTER TABLE videos ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
        elif version not in (0, SCHEMA_VERSION):
            raise DiffletError(f"{path}: job store format {version}, this server reads "
                               f"{SCHEMA_VERSION}; give another --state-dir", where="--state-dir")
        db.executescript(SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except sqlite3.Error as err:
        db.close()
        raise DiffletError(f"{path}: not a Difflet job store ({err}); move it away or give another "
                           f"--state-dir", where="--state-dir") from None
    except BaseException:
        db.close()
        raise
    return db
