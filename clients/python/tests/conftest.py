"""Fixtures: the protocol vectors, and a real ``runlockd`` on a temporary socket.

The agent is built once per session with cargo (set ``RUNLOCKD`` to a built
binary to skip the build) and started per test on ``memory://`` and on
``file://``, so every agent test runs on both backends. The restart tests
also run on ``s3://`` against moto, at ``RUNLOCK_TEST_S3_ENDPOINT`` (which
tests/scripts/moto.sh exports, and scripts/test starts before these tests):
without it they are skipped, or fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator

import pytest

from runlock import testing
from runlock.testing import Agent

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
VECTORS = REPO / "protocol" / "vectors"


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    assert VECTORS.is_dir(), f"no vectors at {VECTORS}"
    return VECTORS


@pytest.fixture(scope="session")
def runlockd() -> Path:
    """Path of a built runlockd: $RUNLOCKD, else `cargo build` in the repository."""
    return testing.runlockd(REPO)


@pytest.fixture(params=["memory", "file"])
def agent(request: pytest.FixtureRequest, runlockd: Path) -> Iterator[Agent]:
    """A fresh agent per test, on memory:// and on file://."""
    # Under /tmp: a Unix socket path must stay under ~108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="runlock-py-", dir="/tmp"))
    backend = "memory://" if request.param == "memory" else f"file://{workdir / 'locks'}"
    try:
        with Agent(runlockd, workdir, backend) as started:
            yield started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def memory_agent(runlockd: Path, workdir: Path) -> Iterator[Agent]:
    """An agent on memory://, whose locks die with it."""
    with Agent(runlockd, workdir, "memory://") as started:
        yield started


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory for agents' sockets, logs and file:// locks (under /tmp:
    a Unix socket path must stay under ~108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="runlock-py-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Backend:
    """A backend URI and the environment an agent needs to use it."""

    name: str
    uri: str
    env: Dict[str, str] = field(default_factory=dict)


def s3_env(endpoint: str) -> Dict[str, str]:
    """What the Rust tests give an agent to use moto (tests/support/stores/s3.rs)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def s3_backend() -> Backend:
    """A fresh bucket in moto. Without RUNLOCK_TEST_S3_ENDPOINT the test is
    skipped, except in CI, where a missing emulator must not pass unnoticed."""
    endpoint = os.environ.get("RUNLOCK_TEST_S3_ENDPOINT")
    if not endpoint:
        why = "RUNLOCK_TEST_S3_ENDPOINT is not set (source tests/scripts/moto.sh; moto_start)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    bucket = f"runlock-py-{secrets.token_hex(6)}"
    # moto accepts an unsigned bucket creation, as the Rust tests use it.
    urllib.request.urlopen(
        urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=10
    ).close()
    return Backend("s3", f"s3://{bucket}/locks", s3_env(endpoint))


@pytest.fixture(params=["file", "s3"])
def surviving_backend(request: pytest.FixtureRequest, workdir: Path) -> Backend:
    """A backend whose leases outlive the agent: file:// (the client holds the
    kernel locks) and s3:// (through moto)."""
    if request.param == "file":
        return Backend("file", f"file://{workdir / 'locks'}")
    return s3_backend()
