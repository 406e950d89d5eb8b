"""The socket rule shared with the shim: explicit, RUNLOCK_SOCKET, config file, root/XDG."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runlock import ConfigError, _socket_path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RUNLOCK_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("RUNLOCK_CONFIG", str(tmp_path / "absent.toml"))


def test_explicit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNLOCK_SOCKET", "/env.sock")
    assert _socket_path.resolve("/explicit.sock") == "/explicit.sock"
    assert _socket_path.resolve(Path("/p.sock")) == "/p.sock"


def test_env_then_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('socket = "/from-config.sock"\n')
    monkeypatch.setenv("RUNLOCK_CONFIG", str(config))
    monkeypatch.setenv("RUNLOCK_SOCKET", "/env.sock")
    assert _socket_path.resolve() == "/env.sock"
    monkeypatch.setenv("RUNLOCK_SOCKET", "")  # empty means unset
    expected = "/from-config.sock" if _socket_path._toml is not None else None
    if expected is None:
        pytest.skip("no tomllib on this Python")
    assert _socket_path.resolve() == expected


def test_unparsable_config_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("socket = \n")
    monkeypatch.setenv("RUNLOCK_CONFIG", str(config))
    assert _socket_path.configured_socket() is None


def test_root_and_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert _socket_path.resolve() == "/run/runlock/agent.sock"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert _socket_path.resolve() == "/run/user/1000/runlock/agent.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    with pytest.raises(ConfigError):
        _socket_path.resolve()
