"""The ``moeproxy`` command line.

Each sub-command lives in its own module under :mod:`moeproxy.cli` and exposes
``register(app)``; the table below is the whole registry.  Modules import heavy
libraries (torch, transformers) inside their command functions so that
``moeproxy --help`` and the light service install never need them.
"""

from __future__ import annotations

import importlib

import typer

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
    "consistency",
    "reproduce",
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


def main() -> None:
    app()
