"""The ``moeproxy`` command line.

Each sub-command lives in its own module under :mod:`moeproxy.cli` and exposes
``register(app)``; the table below is the whole registry.  Modules import heavy
libraries (torch, transformers) inside their command functions so that
``moeproxy --help`` and the light service install never need them.
"""

from __future__ import annotations

import importlib
import sys

import typer

from moeproxy.extras import from_import_error

# Registry: module name under moeproxy.cli -> nothing else to know.
COMMAND_MODULES: tuple[str, ...] = (
    "plan",
    "serve",
    "token",
    "db",
    "demo",
    "build",
    "reference",
    "eval",
    "fingerprints",
    "triage",
    "imports",
    "tail",
    "consistency",
    "reproduce",
    "worker",
)

app = typer.Typer(
    name="moeproxy",
    help="Diagnose RL post-training runs of MoE LLMs and reproduce faults on proxy models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    # A callback keeps typer in group mode even while only one command is
    # registered (otherwise `moeproxy plan ...` would reject "plan").
    pass


for _name in COMMAND_MODULES:
    importlib.import_module(f"moeproxy.cli.{_name}").register(app)


def _command_name(argv: list[str]) -> str | None:
    """The sub-command path of ``argv`` ("reproduce", "fingerprints generate"), for error messages."""
    import click

    command, names = typer.main.get_command(app), []
    for word in argv:
        # typer's groups are not click.Group subclasses in every release: look for the method.
        lookup = getattr(command, "get_command", None)
        sub = lookup(click.Context(command), word) if lookup else None
        if sub is None:
            break
        command, names = sub, [*names, word]
    return " ".join(names) or None


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as exc:
        # A command that needs an optional extra says which one, not a traceback (issue 21).
        missing = from_import_error(exc, _command_name(sys.argv[1:]))
        if missing is None:
            raise
        typer.echo(f"error: {missing}", err=True)
        raise SystemExit(2) from None
