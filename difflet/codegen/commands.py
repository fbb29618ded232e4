"""`difflet codegen IN.ir --backend inductor|neuron --weights DIR|hf:ORG/NAME|random:SEED [--component-file NAME=PATH ...] -o ART [--store DIR] [--verbose]`.

Invariant: torch is imported only inside the command body; every failure is a DiffletError
(the CLI prints `error: ...` and exits 2).
"""
from __future__ import annotations

import click

from difflet.passes.backend_facts import BACKENDS


@click.command("codegen")
@click.argument("ir", type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="inductor", show_default=True,
              help="inductor: torch.export + AOTInductor (CPU/CUDA); neuron: Trainium2 (needs the Neuron SDK).")
@click.option("--weights", required=True, metavar="DIR|hf:ORG/NAME|random:SEED",
              help="A diffusers-format checkpoint directory, hf:ORG/NAME[@REV] from the local "
                   "Hugging Face cache (offline), or random:SEED for seeded random weights.")
@click.option("--component-file", "component_files", multiple=True, metavar="NAME=PATH",
              help="Take component NAME's weights from one file in its original layout (e.g. "
                   "transformer=flux1-dev.safetensors, or a ComfyUI file), converted once into the store "
                   "by diffusers' from_single_file with the config from --weights' NAME/config.json. "
                   "Repeatable.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Artifact directory.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Program store (default $DIFFLET_STORE, $XDG_CACHE_HOME/difflet/store, ~/.cache/difflet/store).")
@click.option("--verbose", is_flag=True, help="Show the compilers' and libraries' own output (warnings, "
              "weight-loading bars); by default one line per program.")
def codegen_cmd(ir: str, backend: str, weights: str, component_files: tuple[str, ...], output: str,
                store: str | None, verbose: bool) -> None:
    """Compile a planned IR's components (reusing the store) into a self-contained artifact directory."""
    from difflet.codegen.backends import get_backend
    from difflet.codegen.driver import codegen
    from difflet.codegen.single_file import parse_component_files, with_component_files
    from difflet.errors import DiffletError
    from difflet.ir.binary import load

    try:
        files = parse_component_files(component_files)
    except DiffletError as err:
        raise click.BadParameter(err.message, param_hint="--component-file") from None
    get_backend(backend)  # a missing toolchain fails before anything is read or written
    module = load(ir)
    if files:
        weights = str(with_component_files(module, weights, files, store, log=click.echo, verbose=verbose))
    codegen(module, weights, output, backend=backend, store=store, log=click.echo, verbose=verbose)


COMMANDS = [codegen_cmd]
