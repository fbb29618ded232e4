"""`difflet-runtime --artifacts ART --port P [--host H]`: the resident serving process.

Invariants:
- The artifacts are loaded once; the port is bound first (health NOT_SERVING), then the warm-up
  generation runs and must pass, and only then health says SERVING and one line
  "listening on HOST:PORT" goes to stdout (what `difflet demo` and tests wait for).
- SIGINT/SIGTERM stop it cleanly (health NOT_SERVING, in-flight requests get a grace period),
  exit code 0. A load or warm-up failure is one "error: ..." line on stderr: exit 2 for bad
  input (DiffletError), 1 otherwise.
"""
from __future__ import annotations

import signal
import sys
import threading

import click

from difflet.errors import DiffletError


class _Interrupted(BaseException):
    """A stop signal before SERVING; a BaseException so loaders' `except Exception` let it pass."""


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--artifacts", "art", required=True, type=click.Path(file_okay=False),
              help="artifact directory written by `difflet codegen`")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port; 0 picks a free one")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--no-verify", is_flag=True, help="skip artifact checksum verification at load")
def main(art: str, port: int, host: str, no_verify: bool) -> None:
    """Serve one compiled profile over gRPC (difflet.v1.Difflet + grpc.health.v1 + reflection)."""
    from difflet.runtime.runner import ModelRunner
    from difflet.runtime.service import DiffletServer

    stop = threading.Event()
    serving = threading.Event()

    def on_signal(signum, frame):  # runs in the main thread
        stop.set()
        if not serving.is_set():
            raise _Interrupted()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server = DiffletServer(lambda: ModelRunner.from_artifacts(art, verify=not no_verify), host, port)
    try:
        bound = server.start()
        server.load()
    except _Interrupted:
        server.stop(grace=0)
        return
    except DiffletError as err:
        server.stop(grace=0)
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except Exception as err:  # a broken artifact or failed warm-up: one line, not a traceback
        server.stop(grace=0)
        click.echo(f"error: {type(err).__name__}: {err}", err=True)
        sys.exit(1)
    serving.set()
    click.echo(f"listening on {host}:{bound}")
    sys.stdout.flush()
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
