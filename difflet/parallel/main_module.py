"""Child processes that never run the caller's script again.

multiprocessing's spawn, and forkserver for each process it starts, hands the child the path
(`__main__.__file__`) or module name (`__main__.__spec__`) of the parent's `__main__` to import as
`__mp_main__` (multiprocessing/spawn.py get_preparation_data, prepare). A script calling the
Python API without an `if __name__ == "__main__":` guard would then run again in every compile
worker and rank: a broken pool or ranks that never report. Difflet's children run only Difflet
functions, so they need nothing of the caller's `__main__`.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def main_not_inherited() -> Iterator[None]:
    """While child processes start, `__main__` has neither `__file__` nor a `__spec__`, so their
    preparation data names no main to import; restored after."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    if main is not None:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None  # spawn reads main.__spec__ unguarded: None, not deleted
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)
