"""Fixtures for the add-on's tests: real ``runlockd`` agents on temporary
sockets, and Meltano projects ("hosts") that use the add-on, on ``file://``,
on ``s3://`` (moto at ``RUNLOCK_TEST_S3_ENDPOINT``, which scripts/test
starts; without it the s3 tests fail, as a missing emulator must), and on a
third party's store (``dummy://``, tests/fixtures/dummy_state_backend).

Run in Meltano's venv, where tests/scripts/meltano.sh installed Meltano, the
client and this add-on (clients/meltano/run-tests.sh does it all).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

import pytest
from runlock import testing
from runlock.testing import Agent

if TYPE_CHECKING:
    from meltano.core.project import Project

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent

#: The state ID (and so the run lock's key) of the hosts' pipeline.
STATE_ID = "dev:tap-counter-to-target-state"

#: The state ID of the hosts' other pipeline (``tap-other``, the same tap).
OTHER_STATE_ID = "dev:tap-other-to-target-state"

#: Bounds each wait on a Meltano run.
MELTANO_BOUND_S = 90.0


@pytest.fixture(scope="session")
def runlockd() -> Path:
    """$RUNLOCKD, else the workspace's debug build (cargo builds it if needed)."""
    return testing.runlockd(REPO)


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Under /tmp: a socket path must stay under ~108 bytes.
    path = Path(tempfile.mkdtemp(prefix="runlock-mel-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def serve_this_process(
    runlockd: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, env: Dict[str, str]
) -> Iterator[Agent]:
    """An agent on ``memory://`` that this test process's own clients (the
    add-on called in-process) reach through ``RUNLOCK_SOCKET``, with no
    configuration of the user's in the way; stopped when the test ends."""
    with Agent(runlockd, workdir, "memory://", env=env) as started:
        monkeypatch.setenv("RUNLOCK_SOCKET", started.socket)
        monkeypatch.delenv("RUNLOCK_ON_UNAVAILABLE", raising=False)
        monkeypatch.setenv("RUNLOCK_CONFIG", str(workdir / "none.toml"))
        yield started


@dataclass
class Store:
    """Where the hosts keep their locks (the agents' backend) and their state
    (Meltano's ``state_backend``), and what both need to reach it."""

    name: str
    lock_uri: str
    state_uri: str
    env: Dict[str, str] = field(default_factory=dict)
    meltano_settings: str = ""


def file_store(workdir: Path) -> Store:
    return Store("file", f"file://{workdir / 'locks'}", f"runlock+file://{workdir / 'state'}")


def s3_store() -> Store:
    endpoint = os.environ.get("RUNLOCK_TEST_S3_ENDPOINT")
    assert endpoint, "RUNLOCK_TEST_S3_ENDPOINT is not set (source tests/scripts/stores.sh; stores_start)"
    bucket = f"runlock-mel-{secrets.token_hex(6)}"
    # moto takes an unsigned bucket creation.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=10).close()
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    # Meltano's S3 store is given its endpoint and keys as Meltano settings,
    # which the add-on must pass on to it.
    settings = (
        "  s3:\n"
        f"    endpoint_url: {endpoint}\n"
        "    aws_access_key_id: test\n"
        "    aws_secret_access_key: test\n"
    )
    return Store("s3", f"s3://{bucket}/locks", f"runlock+s3://{bucket}/state", env, settings)


def dummy_store(workdir: Path) -> Store:
    """A third party's state backend (tests/fixtures/dummy_state_backend,
    which tests/scripts/meltano.sh installs), given its one setting."""
    return Store(
        "dummy", f"file://{workdir / 'locks'}", f"runlock+dummy://{workdir / 'dummy'}",
        meltano_settings="  dummy:\n    suffix: .state\n",
    )


@pytest.fixture(params=["file", "s3", "dummy"])
def store(request: pytest.FixtureRequest, workdir: Path) -> Store:
    if request.param == "s3":
        return s3_store()
    return file_store(workdir) if request.param == "file" else dummy_store(workdir)


class Run:
    """One ``meltano`` process, in a session (process group) of its own."""

    def __init__(self, argv: List[str], cwd: Path, env: Dict[str, str], log: Path):
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=MELTANO_BOUND_S)
        finally:
            self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=MELTANO_BOUND_S)
        self._log.close()


class Host:
    """One runner host: an agent of its own and a Meltano project of its
    own (so its own system database), sharing the store with the others."""

    def __init__(self, name: str, binary: Path, workdir: Path, store: Store, socket_setting: bool = False):
        """``socket_setting``: the project names its agent's socket in the
        add-on's setting (``state_backend.runlock.socket``), and its runs get
        no ``RUNLOCK_SOCKET``."""
        self.name = name
        self.socket_setting = socket_setting
        self.root = workdir / name
        self.root.mkdir()
        self.store = store
        self.agent = Agent(binary, workdir, store.lock_uri, name=f"agent-{name}", env=store.env)
        self.side = self.root / "side"
        self._runs: List[Run] = []
        self._count = 0
        python = sys.executable
        for plugin, script in (("tap-counter", "tap_counter.py"), ("target-state", "target_state.py")):
            path = self.root / plugin
            path.write_text(f'#!/bin/sh\nexec "{python}" "{HERE / script}" "$@"\n')
            path.chmod(0o755)
        (self.root / "meltano.yml").write_text(
            "project_id: runlock-addon-e2e\n"
            "send_anonymous_usage_stats: false\n"
            "default_environment: dev\n"
            "environments:\n- name: dev\n"
            "state_backend:\n"
            f"  uri: {store.state_uri}\n"
            f"{store.meltano_settings}"
            + (f"  runlock:\n    socket: {self.agent.socket}\n" if socket_setting else "")
            + "plugins:\n"
            "  extractors:\n"
            "  - name: tap-counter\n"
            "    namespace: tap_counter\n"
            f"    executable: {self.root / 'tap-counter'}\n"
            "    capabilities: [state]\n"
            "  - name: tap-other\n"
            "    inherit_from: tap-counter\n"
            "  loaders:\n"
            "  - name: target-state\n"
            "    namespace: target_state\n"
            f"    executable: {self.root / 'target-state'}\n"
        )

    def env(self, **extra: str) -> Dict[str, str]:
        keep = {
            k: v for k, v in os.environ.items()
            if not k.startswith(("RUNLOCK_", "MELTANO_", "AWS_", "TAP_"))
        }
        return {
            **keep,
            **self.store.env,
            **({} if self.socket_setting else {"RUNLOCK_SOCKET": self.agent.socket}),
            "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
            "MELTANO_DISABLE_TRACKING": "true",
            "TAP_SIDE": str(self.side),
            **extra,
        }

    def meltano(self, *args: str, wrap: Optional[List[str]] = None, **env: str) -> Run:
        """Starts ``meltano ARGS`` (inside ``wrap`` when given)."""
        self._count += 1
        meltano = str(Path(sys.executable).parent / "meltano")
        run = Run([*(wrap or []), meltano, *args], self.root, self.env(**env), self.root / f"meltano-{self._count}.log")
        self._runs.append(run)
        return run

    def run(self, tag: str, *args: str, wrap: Optional[List[str]] = None, **env: str) -> Run:
        """``meltano run tap-counter target-state ARGS``, its tap tagged ``tag``."""
        return self.meltano("run", "tap-counter", "target-state", *args, wrap=wrap, TAP_TAG=tag, **env)

    def started(self) -> List[int]:
        text = self.side.read_text() if self.side.exists() else ""
        return [int(line.split()[1]) for line in text.splitlines() if line.startswith("started ")]

    def seen(self) -> List[object]:
        """The state each tap was handed, in order."""
        text = self.side.read_text() if self.side.exists() else ""
        return [json.loads(line.split(" ", 2)[2]) for line in text.splitlines() if line.startswith("seen ")]

    def wait_started(self, count: int, run: Run) -> None:
        deadline = time.monotonic() + MELTANO_BOUND_S
        while len(self.started()) < count:
            assert run.proc.poll() is None, f"meltano ended before its tap started: {run.output()}"
            assert time.monotonic() < deadline, f"no tap started: {run.output()}"
            time.sleep(0.05)

    def release_taps(self) -> None:
        Path(str(self.side) + ".release").touch()

    def state(self, state_id: str = STATE_ID) -> object:
        """``meltano state get`` (no run lock is taken)."""
        meltano = str(Path(sys.executable).parent / "meltano")
        done = subprocess.run(
            [meltano, "state", "get", state_id], cwd=self.root, env=self.env(),
            capture_output=True, text=True, timeout=MELTANO_BOUND_S,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def close(self) -> None:
        self.release_taps()
        for run in self._runs:
            # Its whole group: a tap and loader outlive a Meltano killed alone.
            run.kill_group()
        self.agent.stop()


@pytest.fixture
def hosts(runlockd: Path, workdir: Path, store: Store) -> Iterator[List[Host]]:
    """Two hosts, A and B, sharing ``store``."""
    made: List[Host] = []
    try:
        for name in ("a", "b"):
            made.append(Host(name, runlockd, workdir, store))
        yield made
    finally:
        for host in made:
            host.close()


def pg_database() -> str:
    """A new, empty database in the PostgreSQL cluster at
    ``RUNLOCK_TEST_PG_URI`` (tests/scripts/postgres.sh, which scripts/test
    starts), as a SQLAlchemy URI for Meltano (psycopg 3, Meltano's
    ``postgres`` extra)."""
    import psycopg

    uri = os.environ.get("RUNLOCK_TEST_PG_URI")
    assert uri, "RUNLOCK_TEST_PG_URI is not set (source tests/scripts/stores.sh; stores_start)"
    name = f"runlock_mel_{secrets.token_hex(6)}"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    base = uri.rsplit("/", 1)[0]
    return f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"


def s3_bucket() -> str:
    """A new bucket in moto at ``RUNLOCK_TEST_S3_ENDPOINT``."""
    endpoint = os.environ.get("RUNLOCK_TEST_S3_ENDPOINT")
    assert endpoint, "RUNLOCK_TEST_S3_ENDPOINT is not set (source tests/scripts/stores.sh; stores_start)"
    bucket = f"runlock-mel-{secrets.token_hex(6)}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=10).close()
    return bucket


def project_with(workdir: Path, monkeypatch: pytest.MonkeyPatch, database_uri: str, state_backend: str) -> Project:
    """A Meltano project in ``workdir`` on the system database
    ``database_uri``, with ``state_backend`` (YAML, indented under
    ``state_backend:``), found as Meltano finds it."""
    from meltano.core.project import Project

    root = workdir / "project"
    root.mkdir()
    (root / "meltano.yml").write_text(
        "project_id: runlock-tests\nsend_anonymous_usage_stats: false\n"
        f"database_uri: {database_uri}\nstate_backend:\n{state_backend}"
    )
    monkeypatch.setattr(Project, "_default", None)
    monkeypatch.setenv("MELTANO_PROJECT_ROOT", str(root))
    return Project.find()
