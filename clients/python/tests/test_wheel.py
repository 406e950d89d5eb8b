"""The package as it is shipped: the sdist and wheel that ``python -m build``
made, and that wheel installed into a fresh venv, used against a real
runlockd. run-tests.sh builds them and names them in ``RUNLOCK_WHEEL``,
``RUNLOCK_SDIST`` and ``RUNLOCK_WHEEL_PYTHON`` (the fresh venv's python);
without those the tests are skipped, and fail when ``CI`` is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from conftest import REPO
from runlock.testing import Agent

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

#: The subprocess using the installed wheel must end within this.
BOUND_S = 30.0


def built(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        why = f"{variable} is not set (clients/python/run-tests.sh builds the wheel and sets it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return Path(value)


def workspace_version() -> str:
    with (REPO / "Cargo.toml").open("rb") as manifest:
        return str(tomllib.load(manifest)["workspace"]["package"]["version"])


def test_the_wheel_is_typed_and_versioned_as_the_workspace() -> None:
    wheel = built("RUNLOCK_WHEEL")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = HeaderParser().parsestr(archive.read(meta_name).decode())
    assert "runlock/py.typed" in names
    assert "runlock/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/")], names
    assert meta["Name"] == "runlock"
    assert meta["Version"] == workspace_version()
    assert any(r.startswith("msgpack") for r in meta.get_all("Requires-Dist", []))
    assert wheel.name == f"runlock-{workspace_version()}-py3-none-any.whl"


def test_the_sdist_builds_without_the_workspace() -> None:
    # A wheel built from the sdist (as `python -m build` does) cannot read
    # ../../Cargo.toml, so the sdist must carry what setup.py reads instead.
    sdist = built("RUNLOCK_SDIST")
    root = f"runlock-{workspace_version()}"
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
        pkg_info = archive.extractfile(f"{root}/PKG-INFO")
        assert pkg_info is not None
        meta = HeaderParser().parsestr(pkg_info.read().decode())
    for name in ("PKG-INFO", "setup.py", "pyproject.toml", "README.md", "src/runlock/py.typed"):
        assert f"{root}/{name}" in names, sorted(names)
    assert meta["Version"] == workspace_version()


def test_the_installed_wheel_locks_through_the_real_agent(agent: Agent) -> None:
    python = built("RUNLOCK_WHEEL_PYTHON")
    script = textwrap.dedent(
        """
        import json, sys
        from importlib import metadata
        import runlock

        socket, key = sys.argv[1], sys.argv[2]
        with runlock.lock(key, socket=socket, ttl=30) as lease:
            record = runlock.inspect(key, socket=socket)
            try:
                runlock.lock(key, socket=socket)
                second = "granted"
            except runlock.Held as err:
                second = err.code
        after = runlock.inspect(key, socket=socket)
        print(json.dumps({
            "file": runlock.__file__,
            "version": runlock.__version__,
            "dist_version": metadata.version("runlock"),
            "typed": any(str(f).endswith("runlock/py.typed") for f in metadata.files("runlock") or []),
            "token": lease.token,
            "held": [record.state, record.token],
            "second": second,
            "after": after.state,
        }))
        """
    )
    # No PYTHONPATH: the venv must find runlock in its own site-packages.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RUNLOCK_SOCKET")}
    done = subprocess.run(
        [str(python), "-c", script, agent.socket, "dev:wheel-to-agent"],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env=env,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    installed = Path(seen["file"]).resolve()
    assert installed.is_relative_to(python.parent.parent.resolve()), installed
    assert not installed.is_relative_to(REPO.resolve()), installed
    assert seen["version"] == seen["dist_version"] == workspace_version()
    assert seen["typed"]
    assert seen["token"] >= 1
    assert seen["held"] == ["held", seen["token"]]
    assert seen["second"] == "held"
    assert seen["after"] == "free"
