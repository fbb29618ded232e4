"""`difflet check IN.ir --target trn2 [--weights DIR|random:SEED] [--component NAME]`.

Exports every component as codegen does and checks its graph against the target's rules
(difflet/codegen/graph_checks.py). Exit 0 when every component is clean; exit 2 with one line
per violation (DSL file:line, component, rule, op, Python source) otherwise.
Invariant: torch is imported only inside the command body.
"""
from __future__ import annotations

import sys

import click


@click.command("check")
@click.argument("ir", type=click.Path(dir_okay=False))
@click.option("--target", default="trn2", show_default=True, help="a table in difflet/passes/targets/")
@click.option("--weights", default=None, metavar="DIR|random:SEED",
              help="build components from this checkpoint; default: real size on the meta device (no weights)")
@click.option("--component", "only", multiple=True, metavar="NAME", help="check only these components")
@click.option("--store", type=click.Path(file_okay=False), default=None, help="program store (for random:SEED)")
def check_cmd(ir: str, target: str, weights: str | None, only: tuple[str, ...], store: str | None) -> None:
    """Check that every component's exported graph fits the target (no float64, static shapes,
    no data-dependent control flow, attention head_dim within the kernel limit)."""
    from difflet.codegen.graph_checks import check_module
    from difflet.errors import DiffletError
    from difflet.ir.binary import load
    from difflet.passes.targets import load_target

    table = dict(load_target(target))
    module = load(ir)
    names = [c.name for c in module.components()]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise DiffletError(f"no component {unknown[0]!r} (components: {', '.join(names)})", where="--component")
    ckpt = None
    if weights is not None:
        from difflet.codegen.checkpoint import resolve_weights
        from difflet.codegen.store import Store

        ckpt = resolve_weights(module, weights, Store(store).root)
    from difflet.codegen.quiet import quiet_libraries

    with quiet_libraries():  # library warnings (dtype casts, loading) are not findings
        findings = check_module(module, table, ckpt, only)
    bad = 0
    for name, found in findings.items():
        for f in found:
            click.echo(f"error: {f}", err=True)
        bad += len(found)
        if not found:
            click.echo(f"ok {name}")
    if bad:
        click.echo(f"{bad} violation(s) of target {target!r}", err=True)
        sys.exit(2)
    click.echo(f"all {len(findings)} components fit target {target!r}")


COMMANDS = [check_cmd]
