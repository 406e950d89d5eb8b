"""The package's version is the Cargo workspace's ``[workspace.package]
version`` (../../Cargo.toml), as for the Python client beside this one; an
sdist carries it in its PKG-INFO. Everything else is in pyproject.toml."""

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


def version() -> str:
    pkg_info = HERE / "PKG-INFO"
    if pkg_info.is_file():
        return str(HeaderParser().parsestr(pkg_info.read_text(encoding="utf-8"))["Version"])
    with (HERE.parent.parent / "Cargo.toml").open("rb") as manifest:
        return str(tomllib.load(manifest)["workspace"]["package"]["version"])


setup(version=version())
