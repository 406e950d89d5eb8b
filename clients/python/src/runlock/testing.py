"""A real ``runlockd`` for tests: ``Agent`` runs one on a socket of its own,
with nothing of the user's configuration; ``runlockd`` finds the binary.

    with Agent(runlockd(workspace), workdir, "memory://") as agent:
        with runlock.lock("dev:a", socket=agent.socket):
            ...
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket as socket_mod
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Dict, Optional, Type

#: Bounds every start-up and shutdown of an agent.
AGENT_START_TIMEOUT_S = 20.0

#: What an agent does not inherit from the caller's environment: its
#: settings come from its arguments and ``env`` alone, and it is no systemd
#: service, whatever the caller is.
_NOT_INHERITED = ("RUNLOCK_", "AWS_", "NOTIFY_")


def runlockd(workspace: Path) -> Path:
    """Path of a built runlockd: ``$RUNLOCKD``, else the debug build of the
    runlock workspace at ``workspace`` (``cargo build``, with the shim)."""
    given = os.environ.get("RUNLOCKD")
    if given:
        return Path(given)
    cargo = shutil.which("cargo")
    if cargo is None:
        raise RuntimeError("cargo is needed to build runlockd (or set RUNLOCKD to a built binary)")
    subprocess.run(
        [cargo, "build", "-q", "-p", "runlock-agent", "-p", "runlock-shim"], cwd=workspace, check=True
    )
    meta = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        cwd=workspace,
        check=True,
        capture_output=True,
        text=True,
    )
    binary = Path(json.loads(meta.stdout)["target_directory"]) / "debug" / "runlockd"
    if not binary.is_file():
        raise RuntimeError(f"cargo build did not produce {binary}")
    return binary


class Agent:
    """A running runlockd on its own socket, with an empty configuration
    file; ``stop()`` sends SIGTERM (or ``sig``), as leaving a ``with`` block
    does.

    ``name`` tells apart several agents in one ``workdir`` (their socket,
    configuration and log files); ``socket`` puts one on the path of an
    earlier one, as a restart does; ``env`` adds to its environment (a
    store's endpoint and credentials).
    """

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        backend: str,
        *,
        name: str = "agent",
        socket: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
    ):
        self.socket = socket or str(workdir / f"{name}.sock")
        self.backend = backend
        self.log_path = workdir / f"{name}.log"
        config = workdir / f"{name}.toml"
        config.write_text("")
        clean = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "--config", str(config), "--socket", self.socket, "--backend", backend],
            env={**clean, **(env or {})},
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
            probe = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_STREAM)
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
        """Ends the agent (SIGKILL if ``sig`` has not within the bound) and
        returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=AGENT_START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "Agent":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()
