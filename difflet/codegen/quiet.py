"""Third-party noise (warnings, library logging, weight-loading progress bars) silenced for one block.

Invariant: nothing is changed at import time or outside the `with` block; leaving the block
restores the warnings filters, the library verbosities, progress bars and logger levels.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

# loggers that print during export / AOTInductor builds (their own levels override "torch"'s)
TORCH_LOGGERS = ("torch", "torch._dynamo", "torch._inductor", "torch._export", "torch.export",
                 "torch.fx.experimental.symbolic_shapes", "torch._utils_internal")


@contextlib.contextmanager
def quiet_libraries(verbose: bool = False) -> Iterator[None]:
    """With `verbose` a no-op; otherwise warnings are ignored, torch's loggers raised to ERROR and
    diffusers/transformers logging set to errors only without progress bars."""
    if verbose:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        for name in TORCH_LOGGERS:
            logger = logging.getLogger(name)
            stack.callback(logger.setLevel, logger.level)
            logger.setLevel(logging.ERROR)
        for lib in _hf_libraries():
            logging_mod = lib.utils.logging
            stack.callback(logging_mod.set_verbosity, logging_mod.get_verbosity())
            logging_mod.set_verbosity_error()
            stack.callback(_restore_bars, logging_mod, logging_mod.is_progress_bar_enabled())
            logging_mod.disable_progress_bar()
        yield


def _hf_libraries() -> list:
    out = []
    for name in ("transformers", "diffusers"):
        try:
            out.append(__import__(name))
        except ImportError:
            continue
    return out


def _restore_bars(logging_mod, enabled: bool) -> None:
    (logging_mod.enable_progress_bar if enabled else logging_mod.disable_progress_bar)()
