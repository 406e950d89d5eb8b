"""The package's version, from the one place it is kept: the Cargo workspace's
``[workspace.package] version`` (../../Cargo.toml). An sdist carries no
Cargo.toml, so a build from one reads the version the sdist was made with,
from its PKG-INFO. Everything else is in pyproject.toml."""

from __future__ import annotations

import sys
from email.parser import HeaderParser
from pathlib import Path

from setuptools import setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pyproject.toml's build requirements bring tomli to older Pythons
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
WORKSPACE_MANIFEST = HERE.parent.parent / "Cargo.toml"


def version() -> str:
    pkg_info = HERE / "PKG-INFO"
    if pkg_info.is_file():  # an unpacked sdist
        return str(HeaderParser().parsestr(pkg_info.read_text(encoding="utf-8"))["Version"])
    with WORKSPACE_MANIFEST.open("rb") as manifest:
        return str(tomllib.load(manifest)["workspace"]["package"]["version"])


setup(version=version())
