"""`difflet lower FILE.dsl [--profile k=v,...] [--weights DIR [--component-file NAME=PATH]] [--shapes WxH,...] [--batch-sizes 1,2,4] [-o OUT.ir]`: the frontend's CLI command.

Invariant: torch is imported only inside the command body (via lowering's parameter counts);
errors are DiffletErrors, which the CLI group prints as `error: file:line:col: ...`, exit 2.
"""
from __future__ import annotations

import click


@click.command("lower")
@click.argument("dsl", type=click.Path(dir_okay=False), required=False)
@click.option("--profile", "profile", default="", metavar="K=V[,K=V...]",
              help="Override profile parameters, e.g. height=1024,width=1024.")
@click.option("--weights", default=None, metavar="DIR|hf:ORG/NAME",
              help="Take `config from checkpoint` configs from this diffusers-format checkpoint "
                   "(config.json files only) and check stated configs against it.")
@click.option("--component-file", "component_files", multiple=True, metavar="NAME=PATH",
              help="Component NAME's weights are one file in its original layout (converted at "
                   "`difflet codegen --component-file`, which takes the same option); the IR does not "
                   "depend on it (configs come from --weights' NAME/config.json), so here the name and "
                   "the file are only checked. Repeatable.")
@click.option("--shapes", default="", metavar="WxH[,WxH...]",
              help="Serve several sizes from one artifact (video: WxHxF): size-dependent "
                   "components get a program per size, the rest one program.")
@click.option("--batch-sizes", "batches", default="", metavar="1[,B...]",
              help="Also compile the batch-dependent components (the denoiser) at these batch "
                   "sizes, so concurrent requests of one size run as one batched call; the "
                   "description's profile needs a `batch` parameter.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the binary IR here (default: print the text IR to stdout).")
def lower(dsl: str | None, profile: str, weights: str | None, component_files: tuple[str, ...],
          shapes: str, batches: str, output: str | None) -> None:
    """Lower a model description to pipeline IR for one serving profile. Without DSL, the
    description of the --weights checkpoint's family (from its model_index.json)."""
    from difflet.frontend.discover import description_for
    from difflet.frontend.lower import lower_file
    from difflet.frontend.profile import parse_profile_arg

    from difflet.ir.buckets import split_batches, split_sizes

    if dsl is None:
        if weights is None:
            raise click.UsageError("give a model description (DSL), or --weights DIR to take its "
                                   "family's description from DIR/model_index.json")
        dsl = str(description_for(weights, where="--weights"))
    module = lower_file(dsl, parse_profile_arg(profile), weights, split_sizes(shapes) or None,
                        split_batches(batches) or None)
    _check_component_files(module, component_files)
    if output is None:
        from difflet.ir.text import print_module

        click.echo(print_module(module), nl=False)
        return
    from difflet.ir.binary import save

    save(module, output)


def _check_component_files(module, items: tuple[str, ...]) -> None:
    """NAME=PATH: NAME a component of the module (a bucketed one's base name), PATH a file."""
    from pathlib import Path

    from difflet.errors import DiffletError

    names = {c.name.partition("@")[0] for c in module.components()}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r} is not NAME=PATH", param_hint="--component-file")
        if name not in names:
            raise DiffletError(f"{name!r} is not a component of the model (components: "
                               f"{', '.join(sorted(names))})", where="--component-file")
        if not Path(path).is_file():
            raise DiffletError(f"single file for component {name!r} does not exist", where=path)


COMMANDS = [lower]
