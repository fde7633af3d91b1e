"""A command that needs an optional extra names the extra instead of raising an ImportError (issue 21)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from moeproxy.extras import EXTRA_MODULES, MissingExtra, extra_providing, from_import_error, require

# Runs the CLI with torch hidden: a finder ahead of the others refuses it, as a missing install would.
# (None in sys.modules would not do: scipy looks torch up there and breaks on None.)
_HIDE_TORCH = """
import sys

class HideTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideTorch())
sys.argv = ["moeproxy", *sys.argv[1:]]
from moeproxy.cli import main
main()
"""


def _cli_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _HIDE_TORCH, *args], capture_output=True, text=True, timeout=120)


def test_every_extra_module_maps_back_to_its_extra():
    for extra, modules in EXTRA_MODULES.items():
        for module in modules:
            assert extra_providing(module) == extra
            assert extra_providing(f"{module}.sub.module") == extra
    assert extra_providing("numpy") is None
    assert extra_providing(None) is None


def test_an_import_error_of_another_module_is_not_dressed_up():
    assert from_import_error(ModuleNotFoundError("x", name="not_an_extra")) is None
    missing = from_import_error(ModuleNotFoundError("x", name="torch"), "reproduce")
    assert isinstance(missing, MissingExtra)
    assert "`moeproxy reproduce` needs the [ml] extra" in str(missing)
    assert "pip install 'moeproxy[ml]'" in str(missing)


def test_require_checks_without_importing(monkeypatch):
    monkeypatch.setitem(sys.modules, "kmedoids", None)
    with pytest.raises(MissingExtra, match=r"\[ml\] extra \(kmedoids is not installed\)"):
        require("ml", "eval")


@pytest.mark.parametrize("args", [
    ("reproduce", "--model", "qwen3-moe-64e", "--fault", "healthy", "--out", "unused"),
    ("reference", "train", "--name", "qwen3-moe-64e", "--out", "unused"),
    ("fingerprints", "generate", "--model", "unused", "--out", "unused"),
])
def test_a_model_command_without_torch_names_the_extra(args, tmp_path):
    result = _cli_without_torch(*args)
    assert result.returncode == 2, result.stderr
    command = " ".join(a for a in args[:2] if not a.startswith("-"))
    command = command if args[0] in ("reference", "fingerprints") else args[0]
    assert f"`moeproxy {command}` needs the [ml] extra" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_light_commands_run_without_torch():
    assert _cli_without_torch("--help").returncode == 0
    listing = _cli_without_torch("fingerprints", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    assert '"fingerprints"' in listing.stdout
