"""`difflet opt IN.ir --parallel tp4 -o OUT.ir`: plan, check and key a pipeline-level module.

Invariant: torch is never imported (the compiler version is read from package metadata);
an illegal plan or bad option is one `error: ...` line and exit code 2.
"""
from __future__ import annotations

import click

from difflet.errors import DiffletError
from difflet.passes import cp_modes
from difflet.passes.backend_facts import BACKENDS


def _component_tp(values: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for v in values:
        name, _, deg = v.partition("=")
        if not name or not deg.isdigit() or int(deg) < 1:
            raise DiffletError(f"--component-tp expects NAME=N (e.g. text_encoder=4), got {v!r}",
                               where="--component-tp", snippet=v)
        out[name] = int(deg)
    return out


@click.command()
@click.argument("infile", type=click.Path(dir_okay=False))
@click.option("--parallel", default="tp1", show_default=True,
              help="tp4 | tp2cp2 | tp4+sp | tp2+cfg2 | dp2xtp2 | ...")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="planned IR (.ir binary)")
@click.option("--target", default="cpu", show_default=True, help="a table in difflet/passes/targets/")
@click.option("--cores", type=int, default=None, help="cores the plan must use exactly")
@click.option("--attention", type=click.Choice(cp_modes.CHOICES), default=None, help=cp_modes.help_text())
@click.option("--probe", type=click.Choice(["none", "separate", "fused"]), default="none",
              show_default=True)
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="default: the target's first backend")
@click.option("--component-tp", multiple=True, metavar="NAME=N",
              help="own tp degree of an encoder/decoder (default 1, raised automatically when it "
                   "does not fit replicated beside the denoiser)")
@click.option("--front-blocks", type=click.IntRange(0, 9999), default=0, show_default=True,
              help="block mode: compile the denoiser's first K blocks as a front program and the rest "
                   "as another, sharing one copy of the weights (0: one whole program)")
@click.option("--list-legal", is_flag=True, help="print every configuration of --cores cores and exit")
@click.option("--explain-key", is_flag=True, help="print every cache key's inputs as JSON")
@click.option("--text", is_flag=True, help="also print the planned IR as text")
def opt(infile, parallel, output, target, cores, attention, probe, backend, component_tp,
        front_blocks, list_legal, explain_key, text) -> None:
    """Plan parallelism, check legality on a target, extract the probe and key the cache."""
    from difflet.ir.binary import load, save
    from difflet.passes import cache_key, legal_configs
    from difflet.passes.pipeline import Options, optimize
    from difflet.passes.parallel_config import parse_parallel
    from difflet.passes.targets import load_target

    module = load(infile)
    ctp = _component_tp(component_tp)
    if list_legal:
        n = cores or load_target(target)["cores_per_device"]
        be = backend or load_target(target)["backends"][0]
        opts = Options(parallel=parse_parallel("tp1"), target=target, backend=be, probe=probe,
                       component_tp=ctp)
        shown = probe if probe != "none" else "separate"
        click.echo(f"{module.name} on {target}, {n} cores, without the probe and with it ({shown}):")
        click.echo(legal_configs.table(module, opts, n))
        return
    if not output and not explain_key and not text:
        raise click.UsageError("give -o OUT.ir (or --explain-key / --text / --list-legal)")
    planned = optimize(module, parallel=parallel, target=target, backend=backend, probe=probe,
                       attention=attention, cores=cores, component_tp=ctp, front_blocks=front_blocks)
    if output:
        save(planned, output)
    if explain_key:
        click.echo(cache_key.explain(planned))
    if text:
        from difflet.ir.text import print_module

        click.echo(print_module(planned), nl=False)


COMMANDS = [opt]
