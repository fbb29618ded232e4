"""`difflet-runtime`: the API process's command. It serves gRPC and supervises the model
process(es), whose parts `api_server.DiffletServer` assembles; this module is the command line
(options, stop signals, exit codes).

    difflet-runtime --artifacts ART --port P [--queue-size N] [--request-timeout S] [--grace S]
                    [--cache MODE] [--metrics-port P] [--replicas N] [--threads N] [--max-batch N]
                    [--profile KEY=VALUE ...] [--prompt-policy truncate|strict]
                    [--http-port P] [--api-key KEY ...] [--tls-cert PEM --tls-key PEM] [--state-dir DIR]

Invariants:
- Startup order: torch-free artifact checks (manifest vs module.ir, hashes of module.ir, rank
  assignment, --profile), start the model processes' forkserver (it imports torch; this
  process never does), bind the port (health NOT_SERVING; stdout "starting on HOST:PORT"),
  metrics endpoint (stdout "metrics on HOST:PORT"), start the model processes, each loads the
  artifacts (load_artifacts verify=True) and passes its warm-up, and only then health says
  SERVING and stdout says "listening on HOST:PORT" (what `difflet demo` and tests wait for).
- HTTP (--http-port; stdout "http on HOST:PORT", bound before the model processes start) shares
  the admission, dispatcher, metrics and health of the gRPC side; --api-key guards both (gRPC
  health and HTTP /health and / stay open); --tls-cert/--tls-key serve both over TLS. Its
  video jobs and kept files live in --state-dir (locked: a second server on it is refused at
  startup) and survive a restart, `kill -9` included (http/jobstore.py, http/videos.py).
- SIGINT/SIGTERM stop it cleanly (health NOT_SERVING, accepted requests get up to 5 s, the rest
  UNAVAILABLE; model processes stopped), exit code 0. A startup failure is one "error: ..." line
  on stderr: exit 2 for bad input (a refused artifact, a bad option), 1 otherwise.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading

import click

from difflet.errors import DiffletError
from difflet.runtime.api_server import DiffletServer
from difflet.runtime.validate import MAX_TIMEOUT_S, parse_calibration_spec, parse_lora_spec


class _Interrupted(BaseException):
    """A stop signal before SERVING; a BaseException so loaders' `except Exception` let it pass."""


def _check_tls(cert: str, key: str) -> None:
    """Refuse an unusable certificate/key pair before anything starts (issue 14)."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as err:
        raise click.BadParameter(f"{cert} / {key}: not a usable PEM certificate and key "
                                 f"({getattr(err, 'reason', None) or err})",
                                 param_hint="--tls-cert/--tls-key") from None


def _expectations(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--profile")
        out[key.strip()] = value.strip()
    return out


MAX_CALIBRATION_BYTES = 16 << 20  # a calibration file is a few KB: bound what startup reads


def _calibrations(specs: tuple[str, ...]) -> dict[str, str]:
    """--calibration values as NAME -> absolute file; syntax, duplicates and each file's format are
    usage errors here (its ties to the artifact are checked by the model process)."""
    from difflet.stepcache.calibration_file import read_calibration

    out: dict[str, str] = {}
    for spec in specs:
        try:
            name, path = parse_calibration_spec(spec)
        except DiffletError as err:
            raise click.BadParameter(err.message, param_hint="--calibration") from None
        if name in out:
            raise click.BadParameter(f"calibration name {name!r} is given twice", param_hint="--calibration")
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_CALIBRATION_BYTES:
            raise click.BadParameter(f"{path}: not a file of at most {MAX_CALIBRATION_BYTES >> 20} MiB",
                                     param_hint="--calibration")
        try:
            read_calibration(path, "--calibration")
        except DiffletError as err:
            raise click.BadParameter(err.message.removeprefix("--calibration: "), param_hint="--calibration") from None
        out[name] = os.path.abspath(path)
    return out


def _adapters(specs: tuple[str, ...]) -> tuple[tuple[str, str, float], ...]:
    """--lora values as (name, path, scale); syntax, range, duplicates and the files' existence
    are usage errors here (the model process reads the files)."""
    out = []
    for spec in specs:
        try:
            name, path, scale = parse_lora_spec(spec)
        except DiffletError as err:
            raise click.BadParameter(err.message, param_hint="--lora") from None
        if name in {n for n, _, _ in out}:
            raise click.BadParameter(f"adapter name {name!r} is given twice", param_hint="--lora")
        if not os.path.isfile(path):
            raise click.BadParameter(f"{path}: no such file", param_hint="--lora")
        out.append((name, os.path.abspath(path), scale))
    return tuple(out)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--artifacts", "art", required=True, type=click.Path(file_okay=False),
              help="artifact directory written by `difflet codegen`")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port; 0 picks a free one")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--queue-size", default=16, show_default=True, type=click.IntRange(0, 100000),
              help="requests that may wait beyond one running per replica; more are refused")
@click.option("--request-timeout", default=0.0, show_default=True, type=click.FloatRange(0, MAX_TIMEOUT_S),
              help="seconds from admission to answer (queue included); 0 = only gRPC deadlines")
@click.option("--grace", default=10.0, show_default=True, type=click.FloatRange(0),
              help="seconds a cancelled generation may take to stop before its process is killed")
@click.option("--cache", default="off", show_default=True,
              help="step-cache mode: off | cadence:N | online-delta:ALPHA | calibrated:NAME|FILE[:THRESHOLD] | "
                   "block[:THRESHOLD] (an artifact built with `difflet opt --front-blocks K`), "
                   "each optionally +forecast[:K] and +keep:INITIAL:FINAL")
@click.option("--calibration", "calibrations", multiple=True, metavar="NAME=FILE",
              help="a calibration file (`difflet calibrate`) that requests may use as cache "
                   "`calibrated:NAME` (repeatable); a request never names a file")
@click.option("--metrics-port", default=None, type=click.IntRange(0, 65535),
              help="serve Prometheus metrics on this port (0 picks one)")
@click.option("--replicas", default=0, show_default=True, type=click.IntRange(0, 64),
              help="model processes, each on its own cores; each request goes to the one with "
                   "the fewest in flight; 0 = the artifact's data-parallel degree (dp2xtp2: 2)")
@click.option("--threads", default=0, show_default=True, type=click.IntRange(0, 1024),
              help="torch threads per model process; 0 = cpu_count // replicas")
@click.option("--max-batch", default=0, show_default=True, type=click.IntRange(0, 256),
              help="requests of one size a model process runs together, their denoiser calls "
                   "batched (artifacts lowered with --batch-sizes); 0 = the largest compiled "
                   "batch size, 1 = no batching")
@click.option("--profile", "expect", multiple=True, metavar="KEY=VALUE",
              help="serving profile the artifacts must match (model, height, tp, ...); repeatable")
@click.option("--no-verify", is_flag=True, help="skip artifact checksum verification at load")
@click.option("--lora", "loras", multiple=True, metavar="NAME=PATH[:SCALE]",
              help="load a LoRA adapter (a file diffusers' load_lora_weights reads) under NAME, merged at "
                   "SCALE (default 1.0) into the same programs when a request names it in `lora` "
                   "(repeatable; nothing is compiled)")
@click.option("--lossless-video", is_flag=True,
              help="encode videos as lossless RGB H.264 (qp 0): the MP4 decodes to the generated "
                   "frames exactly; larger files, which browsers do not play")
@click.option("--prompt-policy", default="truncate", show_default=True,
              type=click.Choice(["truncate", "strict"]),
              help="over-long prompts: truncate per encoder as the reference pipeline does "
                   "(reported in the reply), or refuse them (INVALID_ARGUMENT)")
@click.option("--max-image-mb", default=0.0, show_default=True, type=click.FloatRange(0, 4096),
              help="image-input models: the most bytes of one input image file, in MiB "
                   "(0: 4 bytes per --max-image-pixels + 1 MiB)")
@click.option("--max-image-pixels", default=0, show_default=True, type=click.IntRange(0, 2**31 - 1),
              help="image-input models: the most pixels (width x height) of one input image, read from "
                   "its header before decoding (0: 16 x the largest served size, at least 4 MP)")
# ---- HTTP API, API key, TLS (issue 14)
@click.option("--http-port", default=None, type=click.IntRange(0, 65535),
              help="serve the OpenAI-compatible HTTP API and playground on this port (0 picks one)")
@click.option("--api-key", "api_keys", envvar="DIFFLET_API_KEY", multiple=True,
              help="require a key (Bearer on HTTP, authorization metadata on gRPC); repeatable: each "
                   "key's holders see only the jobs they made [env DIFFLET_API_KEY, keys separated "
                   "by spaces]")
@click.option("--tls-cert", default=None, type=click.Path(dir_okay=False, exists=True),
              help="PEM certificate chain: serve gRPC and HTTP over TLS (with --tls-key)")
@click.option("--tls-key", default=None, type=click.Path(dir_okay=False, exists=True),
              help="PEM private key of --tls-cert")
@click.option("--http-content-retention", default=3600.0, show_default=True,
              type=click.FloatRange(0, min_open=True),
              help="seconds finished videos (and image url replies) are kept")
@click.option("--http-content-mb", default=1024, show_default=True, type=click.IntRange(1),
              help="disk bound of kept videos and images; the oldest go first")
@click.option("--state-dir", default=None, type=click.Path(file_okay=False),
              help="HTTP: where video jobs and kept files survive a restart, one server per "
                   "directory [default: $XDG_STATE_HOME/difflet or ~/.local/state/difflet]")
def main(art: str, port: int, host: str, queue_size: int, request_timeout: float, grace: float,
         cache: str, metrics_port: int | None, replicas: int, threads: int,
         expect: tuple[str, ...], no_verify: bool, http_port: int | None, api_keys: tuple[str, ...],
         tls_cert: str | None, tls_key: str | None, http_content_retention: float,
         http_content_mb: int, prompt_policy: str, max_batch: int, loras: tuple[str, ...],
         lossless_video: bool, calibrations: tuple[str, ...], state_dir: str | None,
         max_image_mb: float, max_image_pixels: int) -> None:
    """Serve one compiled profile over gRPC (difflet.v1.Difflet + grpc.health.v1 + reflection)."""
    stop = threading.Event()
    serving = threading.Event()

    def on_signal(signum, frame):  # runs in the main thread
        stop.set()
        if not serving.is_set():
            raise _Interrupted()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` dumps stacks
    server = None
    try:
        if (tls_cert is None) != (tls_key is None):
            raise click.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert")
        if tls_cert:
            _check_tls(tls_cert, tls_key)
        if state_dir and http_port is None:  # only the HTTP API's video jobs are kept there
            raise click.BadParameter("it keeps the HTTP API's jobs: give --http-port too",
                                     param_hint="--state-dir")
        adapters = _adapters(loras)
        server = DiffletServer(art, host, port, queue_size=queue_size,
                               request_timeout=request_timeout or None, grace=grace, cache=cache,
                               replicas=replicas, expect=_expectations(expect), verify=not no_verify,
                               threads=threads, prompt_policy=prompt_policy, api_keys=api_keys,
                               tls=(tls_cert, tls_key) if tls_cert else None, max_batch=max_batch or None,
                               lossless_video=lossless_video, loras=adapters,
                               calibrations=_calibrations(calibrations),
                               image_bounds=(int(max_image_mb * (1 << 20)), max_image_pixels))
        bound = server.start()
        click.echo(f"starting on {host}:{bound}")
        if metrics_port is not None:
            click.echo(f"metrics on {host}:{server.metrics.serve(host, metrics_port)}")
        if http_port is not None:
            from difflet.runtime.http.jobstore import default_state_dir

            http_bound = server.start_http(http_port, http_content_retention, http_content_mb,
                                           state_dir or str(default_state_dir()))
            click.echo(f"http on {host}:{http_bound}")
        sys.stdout.flush()
        server.load()
    except _Interrupted:
        if server is not None:
            server.stop(grace=0)
        return
    except (DiffletError, click.BadParameter, OSError) as err:
        if server is not None:
            server.stop(grace=0)
        message = err.format_message() if isinstance(err, click.BadParameter) else str(err)
        click.echo(f"error: {message}", err=True)
        sys.exit(2)
    except Exception as err:  # anything unforeseen: one line, not a traceback (a model process's
        # failed load or warm-up arrives as a DiffletError above: exit 2)
        if server is not None:
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
