"""Package mapping only; metadata lives in pyproject.toml.

The stage folders sit at the repository root (SPEC section 6) but install as
``moeproxy.<stage>`` so nothing generic such as ``service`` lands at the top of
site-packages.  setuptools cannot rename folders from pyproject.toml alone, so
the package list is computed here from the folders themselves.
"""

from setuptools import find_packages, setup

STAGES = {
    "moeproxy.service": "service",
    "moeproxy.signatures": "signatures",
    "moeproxy.proxy_builder": "proxy_builder",
    "moeproxy.reproduction": "reproduction",
    "moeproxy.migrations": "migrations",
}


def _packages() -> list[str]:
    packages = ["moeproxy", *("moeproxy." + p for p in find_packages("moeproxy"))]
    for name, folder in STAGES.items():
        packages.append(name)
        packages.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return packages


setup(
    packages=_packages(),
    package_dir={"moeproxy": "moeproxy", **STAGES},
    package_data={"": ["*.json", "*.jsonl", "*.html", "*.js", "*.css", "*.txt", "*.safetensors", "*.ini", "*.mako", "*.md"]},
    include_package_data=True,
)
