"""Which optional extra provides which import (pyproject.toml ``[project.optional-dependencies]``).

The light install (``pip install -e .``) runs the service, the signature engine and every command
that needs no model; commands that load or train a model need ``[ml]``.  When one of those is run
without its extra, the user is told which extra to install instead of seeing an ImportError.
"""

from __future__ import annotations

import importlib.util

# Registry: extra -> top-level modules it brings (the ones the code imports).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "ml": ("torch", "transformers", "safetensors", "kmedoids", "accelerate", "tokenizers"),
    "npu": ("torch_npu",),
    "ray": ("ray",),
    "tensorboard": ("tensorboard", "google_crc32c"),
}


class MissingExtra(RuntimeError):
    """A command needs an optional extra that is not installed."""

    def __init__(self, extra: str, module: str, command: str | None = None) -> None:
        self.extra, self.module, self.command = extra, module, command
        who = f"`moeproxy {command}`" if command else "this command"
        super().__init__(
            f"{who} needs the [{extra}] extra ({module} is not installed): "
            f"pip install 'moeproxy[{extra}]' (from a checkout: pip install -e '.[{extra}]')"
        )


def extra_providing(module: str | None) -> str | None:
    """The extra whose install brings ``module`` (a dotted name counts by its top level), else None."""
    top = (module or "").partition(".")[0]
    for extra, modules in EXTRA_MODULES.items():
        if top in modules:
            return extra
    return None


def require(extra: str, command: str | None = None) -> None:
    """Raise MissingExtra unless every module of ``extra`` can be imported (checked without importing)."""
    for module in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install or a finder that refuses the module
            found = False
        if not found:
            raise MissingExtra(extra, module, command)


def from_import_error(exc: ModuleNotFoundError, command: str | None = None) -> MissingExtra | None:
    """The MissingExtra an ImportError of an extra's module stands for, or None for any other module."""
    extra = extra_providing(exc.name)
    return None if extra is None else MissingExtra(extra, exc.name or "", command)
