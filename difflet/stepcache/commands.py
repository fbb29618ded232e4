"""`difflet calibrate ART --prompts FILE [--steps N] [-o CAL.json]`: fit step caching to an artifact.

Invariants: torch is imported only inside the command body; a bad flag or file is a DiffletError
naming it (exit 2). The written file is versioned and tied to ART's probe/denoiser cache keys
and denoiser weights; `calibrated:CAL.json` on another artifact is refused.
"""
from __future__ import annotations

from pathlib import Path

import click

from difflet.errors import DiffletError


def read_prompts(path: str) -> list[str]:
    """Prompts, one per line; blank lines and lines starting with '#' are skipped."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise DiffletError(f"cannot read the prompts file: {err}", where="--prompts") from None
    prompts = [line.strip() for line in text.splitlines()]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise DiffletError("the prompts file has no prompts", where="--prompts")
    return prompts


@click.command("calibrate")
@click.argument("art", type=click.Path(file_okay=False))
@click.option("--prompts", "prompts_file", required=True, type=click.Path(dir_okay=False),
              help="recording prompts, one per line (use prompts other than your evaluation prompts)")
@click.option("--steps", type=int, default=None, help="denoising steps of the reference runs (default: profile)")
@click.option("-o", "--output", default="calibration.json", show_default=True, help="calibration file to write")
@click.option("--degree", type=click.IntRange(1, 6), default=2, show_default=True, help="polynomial degree")
@click.option("--per-step", is_flag=True, help="compare each step's estimate with the threshold (default: accumulate)")
@click.option("--target-skips", type=float, default=None,
              help="cached steps per generation the threshold aims at (default: cadence 2's)")
@click.option("--target-psnr", type=float, default=None,
              help="instead: the largest skip budget whose cached runs keep this mean PSNR (dB)")
@click.option("--seed", type=int, default=0, show_default=True)
def calibrate_cmd(art, prompts_file, steps, output, degree, per_step, target_skips, target_psnr, seed):
    """Record probe scores and output changes without caching, fit the curve, pick a mode."""
    from difflet.runtime.runner import ModelRunner
    from difflet.stepcache.calibrate import calibrate
    from difflet.stepcache.calibration_file import write_calibration

    prompts = read_prompts(prompts_file)
    if target_skips is not None and target_skips < 0:
        raise DiffletError(f"--target-skips {target_skips:g} must be >= 0", where="--target-skips")
    if not Path(art).is_dir():
        raise DiffletError("artifact directory does not exist", where=art)
    runner = ModelRunner.from_artifacts(art)
    steps = int(runner.profile["steps"]) if steps is None else steps
    data = calibrate(runner, prompts, steps, degree=degree, accumulate=not per_step,
                     target_skips=target_skips, target_psnr=target_psnr, seed=seed, log=click.echo)
    data["mode"] = data["mode"].format(file=output)
    write_calibration(output, data)
    click.echo(f"wrote {output}: R^2 {data['r2']:.3f}, selected {data['mode']}, "
               f"threshold {data['threshold']:.6g}")


COMMANDS = [calibrate_cmd]
