"""The layering contract (issue 15, item 9): .ci/lint_imports passes on this checkout's wheel and
fails, naming the contract, when a stage imports upward or the signature library imports torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "lint_imports"


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    site = out / "site"
    zipfile.ZipFile(next(out.glob("moeproxy-*.whl"))).extractall(site)
    return site


def lint(site: Path) -> subprocess.CompletedProcess:
    env_bin = str(Path(sys.executable).parent)
    return subprocess.run(
        ["bash", str(SCRIPT), str(site)], capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": f"{env_bin}:/usr/bin:/bin", "HOME": str(site)},
    )


def test_the_wheel_keeps_every_contract(unpacked_wheel):
    result = lint(unpacked_wheel)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("signatures/_backwards.py", "from moeproxy.service import app\n", "Stages import only downward"),
        ("proxy_builder/_backwards.py", "import moeproxy.reproduction.engine\n", "Stages import only downward"),
        ("signatures/_heavy.py", "import torch\n", "The signature library needs no torch"),
        ("client_extra.py", "from moeproxy.service.metrics import codec\n", None),  # not under a contract
        ("integrations/_db.py", "import sqlalchemy\n", "The client and the framework integrations speak HTTP only"),
        ("importers/_service.py", "from moeproxy.service.runs import repository\n", "The importers read files"),
    ],
)
def test_a_deliberate_bad_import_breaks_its_contract(unpacked_wheel, tmp_path, module, line, contract):
    site = tmp_path / "site"
    shutil.copytree(unpacked_wheel, site)
    (site / "moeproxy" / module).write_text(line)
    result = lint(site)
    if contract is None:
        assert result.returncode == 0, result.stdout[-3000:]
        return
    assert result.returncode != 0
    assert contract in result.stdout and "BROKEN" in result.stdout
