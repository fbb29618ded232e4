"""Model processes as OS processes: the forkserver they fork from, their process groups, and the
last-resort kill at API-process exit. Torch-free (torch is imported in the forkserver only).

Invariants:
- Every model process forks from one forkserver that imported torch and the host steps once
  (`prestart`), so a (re)start skips those imports; the API process itself never imports them.
- `kill_group` SIGKILLs a model process's whole group (it leads one: rank workers it started are
  in it) and confirms the exit (join); a process started with `CTX` is in `LIVE` until then.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import signal

CTX = multiprocessing.get_context("forkserver")
LIVE: set = set()  # started model processes not yet confirmed dead (see _kill_leftovers)


SUN_PATH_MAX = 107  # bytes of a Linux AF_UNIX socket path (sockaddr_un.sun_path, NUL excluded)


def socket_safe_tempdir() -> None:
    """Give multiprocessing a socket directory whose paths fit AF_UNIX: it binds the forkserver's
    socket at $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, which a deep $TMPDIR makes too long
    ("AF_UNIX path too long"). Python 3.14 falls back to /tmp itself (cpython issue 132124,
    multiprocessing.util._get_base_temp_dir); this does the same on older versions, for
    multiprocessing's own directory only ($TMPDIR stays the process's)."""
    import shutil
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config  # what util.get_temp_dir() reads and caches
    if config.get("tempdir") is not None or len(tempfile.gettempdir()) + 32 <= SUN_PATH_MAX:
        return
    base = next((d for d in ("/tmp", "/var/tmp", "/usr/tmp") if os.access(d, os.W_OK | os.X_OK)), None)
    if base is not None:
        config["tempdir"] = tempfile.mkdtemp(prefix="pymp-", dir=base)
        util.Finalize(None, shutil.rmtree, args=[config["tempdir"], True], exitpriority=-100)


def prestart(preload: list[str]) -> None:
    """Start the forkserver now, importing `preload` (torch, the runner, host steps) there while
    the API process goes on with its own startup; model processes then fork from it."""
    socket_safe_tempdir()
    CTX.set_forkserver_preload(list(preload))
    from multiprocessing import forkserver

    forkserver.ensure_running()


@atexit.register
def _kill_leftovers() -> None:
    """Last resort at API-process exit: SIGKILL the group of any model process still alive.
    Registered after multiprocessing's own exit hook, so it runs first (atexit is LIFO) and
    that hook never waits on a non-daemonic model process that would not exit by itself."""
    for proc in list(LIVE):
        kill_group(proc)


def kill_group(proc) -> None:
    """SIGKILL `proc`'s process group (it and any workers it started), confirm its exit."""
    if proc.pid:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # no group (yet, or any more): the process itself is handled below
    if proc.is_alive():
        proc.kill()
    proc.join()  # confirm the exit
    LIVE.discard(proc)
