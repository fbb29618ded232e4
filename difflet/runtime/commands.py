"""CLI commands of the runtime area: `difflet generate` (a gRPC client) and `difflet demo`.

Invariants: torch and grpc are imported inside command bodies; a gRPC failure is one stderr
line, exit 2 for INVALID_ARGUMENT (the user's request was wrong), exit 1 for anything else.
`difflet generate` calls GenerateStream and draws its progress on stderr only when stderr is a
terminal (or --progress), so scripts and logs get just the result line; a prompt the server
truncated adds one "note: truncated ..." line on stderr. Its request options are derived from
request.Request (one --NAME per field).
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from difflet.passes import cp_modes  # torch-free
from difflet.passes.targets import load_target, target_names  # torch-free

# the targets whose table names a torch device: where inductor programs (the demo's) can run
DEVICE_TARGETS = [t for t in target_names() if load_target(t).get("device")]
from difflet.runtime.demo import MODELS as DEMO_MODELS  # stdlib-only module: no torch at CLI start
from difflet.runtime.request import FIELDS


def request_options(command):
    """One option per request field but the prompt (request.FIELDS): --NAME, its type, default
    and doc; the server checks the values (a bad one exits 2, as INVALID_ARGUMENT)."""
    for f in reversed(FIELDS):
        if f.name != "prompt":
            command = click.option(f"--{f.name.replace('_', '-')}", f.name, type=f.kind, default=f.default,
                                   show_default=f.name == "seed", help=f.doc)(command)
    return command


@click.command()
@click.argument("prompt")
@click.option("--server", required=True, help="HOST:PORT of a difflet-runtime")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="file to write: a PNG (image models) or an MP4 (video models)")
@request_options
@click.option("--image", "images", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="an input image file (PNG, JPEG or WebP) of an image-input model; repeat for several")
@click.option("--mask", "mask", default=None, type=click.Path(dir_okay=False, exists=True),
              help="inpainting: the mask image file (white = repaint, black = keep)")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=600.0,
              show_default=True, help="deadline in seconds (queue time included)")
@click.option("--progress/--no-progress", default=None,
              help="draw a progress bar on stderr (default: when stderr is a terminal)")
@click.option("--api-key", envvar="DIFFLET_API_KEY", default=None,
              help="the server's API key [env DIFFLET_API_KEY]")
@click.option("--tls-ca", default=None, type=click.Path(dir_okay=False, exists=True),
              help="connect over TLS, trusting this PEM CA certificate")
def generate(prompt: str, server: str, output: str, timeout: float, progress: bool | None,
             api_key: str | None, tls_ca: str | None, images: tuple[str, ...], mask: str | None,
             **fields) -> None:
    """Generate one image (PNG) or video (MP4) on a running difflet-runtime and write it."""
    import grpc

    from difflet.runtime import client

    fields["image"] = [Path(p).read_bytes() for p in images] or None  # the server decodes them
    fields["mask_image"] = Path(mask).read_bytes() if mask else None

    bar = ProgressBar(enabled=sys.stderr.isatty() if progress is None else progress)
    reply = None
    try:
        for event in client.generate_stream(server, prompt, timeout=timeout, api_key=api_key,
                                            tls_ca=tls_ca, **fields):
            if event.HasField("progress"):
                bar.update(event.progress.step, event.progress.total, event.progress.cached)
            elif event.HasField("result"):
                reply = event.result
    except grpc.RpcError as err:
        bar.close()
        code = err.code()
        click.echo(f"error: {server}: {code.name}: {err.details()}", err=True)
        sys.exit(2 if code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    bar.close()
    if reply is None:
        click.echo(f"error: {server}: the stream ended without a result", err=True)
        sys.exit(1)
    data, kind = (reply.mp4, "mp4") if reply.mp4 else (reply.png, "png")
    try:
        Path(output).write_bytes(data)
    except OSError as err:
        from difflet.errors import DiffletError

        raise DiffletError(f"cannot write the {kind.upper()}: {err.strerror}", where=output) from None
    if Path(output).suffix.lower() != f".{kind}":  # written all the same: a result is never lost
        click.echo(f"note: the server returned {kind.upper()} data; {output} holds it", err=True)
    notice = client.truncation_notice(reply)
    if notice:
        click.echo(notice, err=True)
    t = reply.timings
    cached = f", {reply.cached_steps} cached" if reply.cached_steps else ""
    size = f"{reply.width}x{reply.height}" + (f"x{reply.frames} frames at {reply.fps:g} fps" if reply.frames else "")
    click.echo(f"wrote {output} ({size}, seed {reply.seed}, {reply.steps} "
               f"steps{cached}; encode {t.encode_ms:.0f} ms, denoise {t.denoise_ms:.0f} ms, "
               f"decode {t.decode_ms:.0f} ms)")


class ProgressBar:
    """`step 3/4 [###########-----]` redrawn in place on stderr; one final newline."""

    WIDTH = 30

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.drawn = enabled, False

    def update(self, step: int, total: int, cached: bool) -> None:
        if not self.enabled or total <= 0:
            return
        filled = self.WIDTH * step // total
        note = " (cached)" if cached else ""
        click.echo(f"\rstep {step}/{total} [{'#' * filled}{'-' * (self.WIDTH - filled)}]{note}   ",
                   err=True, nl=False)
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            click.echo("", err=True)
            self.drawn = False


@click.command()
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="file to write [default: demo.png, or demo.mp4 for a video model]")
@click.argument("prompt_arg", metavar="[PROMPT]", required=False)
@click.option("--prompt", default=None,
              help='same as PROMPT (default: "a yellow triangle on a black background")')
@click.option("--model", type=click.Choice(list(DEMO_MODELS)),
              default="flux-shapes", show_default=True,
              help="flux-shapes: the shipped trained weights; *-tiny*: each family at toy size, "
                   "random:0 weights")
@click.option("--seed", default=42, show_default=True, type=int)
@click.option("--parallel", default="tp1", show_default=True, metavar="CONFIG",
              help="parallel layout to plan and compile (tp2, tp2cp2, tp2+sp, dp2xtp2, ...; "
                   "the planner must call it legal and codegen build it)")
@click.option("--attention", default=None, type=click.Choice(cp_modes.CHOICES),
              help="context-parallel attention mode (with cpN in --parallel)")
@click.option("--target", default="cpu", show_default=True, type=click.Choice(DEVICE_TARGETS),
              help="where the programs run: this machine's CPU, or its CUDA device (the host stays on the CPU)")
@click.option("--store", default=None, type=click.Path(file_okay=False),
              help="program store (default: $DIFFLET_STORE or the user cache)")
@click.option("--lossless-video", is_flag=True,
              help="video models: write a lossless RGB H.264 MP4 (difflet-runtime --lossless-video)")
@click.option("--verbose", is_flag=True,
              help="also print codegen's line per program and the libraries' own warnings and bars")
def demo(output: str, prompt_arg: str | None, prompt: str | None, model: str, seed: int,
         parallel: str, attention: str | None, target: str, store: str | None, verbose: bool,
         lossless_video: bool) -> None:
    """Lower, optimize, compile and serve a bundled model (default: the trained flux-shapes);
    generate one image (PNG) or video (MP4)."""
    from difflet.runtime.demo import DEFAULT_PROMPT, run_demo

    if prompt_arg and prompt and prompt_arg != prompt:
        raise click.UsageError("give the prompt once (PROMPT or --prompt)")
    run_demo(Path(output) if output else None, prompt_arg or prompt or DEFAULT_PROMPT, Path(store) if store else None,
             seed=seed, log=click.echo, model=model, verbose=verbose, parallel=parallel,
             attention=attention, target=target, lossless_video=lossless_video)


COMMANDS = [generate, demo]
