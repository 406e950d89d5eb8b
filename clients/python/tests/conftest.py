"""Fixtures: the protocol vectors, and a real ``runlockd`` on a temporary socket.

The agent is built once per session with cargo (set ``RUNLOCKD`` to a built
binary to skip the build) and started per test on ``memory://`` and on
``file://``, so every agent test runs on both backends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
VECTORS = REPO / "protocol" / "vectors"

#: Bounds every start-up and shutdown of the agent.
AGENT_START_TIMEOUT_S = 20.0


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    assert VECTORS.is_dir(), f"no vectors at {VECTORS}"
    return VECTORS


@pytest.fixture(scope="session")
def runlockd() -> Path:
    """Path of a built runlockd: $RUNLOCKD, else `cargo build` in the repository."""
    given = os.environ.get("RUNLOCKD")
    if given:
        return Path(given)
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo is needed to build runlockd (or set RUNLOCKD to a built binary)")
    subprocess.run(
        [cargo, "build", "-q", "-p", "runlock-agent", "-p", "runlock-shim"], cwd=REPO, check=True
    )
    meta = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    binary = Path(json.loads(meta.stdout)["target_directory"]) / "debug" / "runlockd"
    assert binary.is_file(), f"cargo build did not produce {binary}"
    return binary


class Agent:
    """A running runlockd on its own socket; ``stop()`` sends SIGTERM."""

    def __init__(self, binary: Path, workdir: Path, backend: str):
        self.socket = str(workdir / "agent.sock")
        self.backend = backend
        self.log_path = workdir / "agent.log"
        # Only this test's settings: an empty config file, no inherited RUNLOCK_*.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOCK_")}
        env.pop("NOTIFY_SOCKET", None)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "--config", str(workdir / "runlockd.toml"),
             "--socket", self.socket, "--backend", backend],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Polls until the socket accepts a connection (bounded), failing fast if the agent exits."""
        deadline = time.monotonic() + AGENT_START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"runlockd exited with {self.proc.returncode}: {self.log()}")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.socket)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"runlockd did not listen within {AGENT_START_TIMEOUT_S}s: {self.log()}")
                time.sleep(0.02)
            finally:
                probe.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=AGENT_START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(params=["memory", "file"])
def agent(request: pytest.FixtureRequest, runlockd: Path) -> Iterator[Agent]:
    """A fresh agent per test, on memory:// and on file://."""
    # Under /tmp: a Unix socket path must stay under ~108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="runlock-py-", dir="/tmp"))
    (workdir / "runlockd.toml").write_text("")
    backend = "memory://" if request.param == "memory" else f"file://{workdir / 'locks'}"
    started = Agent(runlockd, workdir, backend)
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(workdir, ignore_errors=True)
