"""The `difflet` command. Each area owns its commands in `<area>/commands.py`.

Invariant: command modules import torch only inside command bodies, so `difflet show` and
`difflet lower --help` stay fast; a DiffletError becomes one stderr line and exit code 2.
"""
from __future__ import annotations

import sys

import click

from difflet.errors import DiffletError


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DiffletError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="difflet")
def main() -> None:
    """Difflet: lower, optimize, compile and serve diffusion transformers."""


def _register() -> None:
    import importlib

    for module in ("difflet.ir.commands", "difflet.frontend.commands", "difflet.passes.commands",
                   "difflet.codegen.commands", "difflet.codegen.check_command",
                   "difflet.runtime.commands",
                   "difflet.stepcache.commands"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):
                raise  # a missing dependency inside an existing module is a real error
            continue
        for cmd in getattr(mod, "COMMANDS", ()):
            main.add_command(cmd)


_register()

if __name__ == "__main__":
    main()
