"""`difflet show FILE`: print an IR file (binary or text) in its text form.

Invariant: torch-free and fast; bad files surface as DiffletError (exit 2, one line).
"""
from __future__ import annotations

import click


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--verify/--no-verify", "check", default=False,
              help="Also run the IR verifier and fail (exit 2) on the first broken rule.")
def show(file: str, check: bool) -> None:
    """Print FILE (a .ir binary or its text form) as text IR."""
    from difflet.ir.binary import load
    from difflet.ir.text import print_module

    module = load(file)
    if check:
        from difflet.ir.verify import verify

        verify(module)
    click.echo(print_module(module), nl=False)


COMMANDS = [show]
