"""Every ``meltano state`` subcommand leaves the same state through a
``runlock+`` backend as through the plain one: the real Meltano, two
projects side by side, one with ``state_backend.uri`` = URI and one with
``runlock+URI``, run the same commands over the same existing state, and
their stores are compared after each (their raw contents, and the output
of ``get``, ``list`` and ``export``), on ``file://``, ``s3://`` (moto), a
third party's store (``dummy://``, tests/fixtures/dummy_state_backend) and
the system database on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import select
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from conftest import HERE, MELTANO_BOUND_S, pg_database, s3_bucket
from runlock.testing import Agent

Snapshot = Callable[[], object]


class Project:
    """A Meltano project with no plugins: only its state is used."""

    def __init__(self, root: Path, uri: str, extra: str):
        self.root = root
        root.mkdir()
        (root / "meltano.yml").write_text(
            "project_id: runlock-state-commands\n"
            "send_anonymous_usage_stats: false\n"
            f"{extra}"
            "state_backend:\n"
            f"  uri: {uri}\n"
        )
        self.env: Dict[str, str] = {}
        editor = root / "editor"
        # `meltano state edit` runs $EDITOR on a file: this one replaces its content.
        editor.write_text('#!/bin/sh\nprintf \'%s\' \'{"singer_state": {"edited": true}}\' > "$1"\n')
        editor.chmod(0o755)
        self.editor = str(editor)

        self.forks: Optional[subprocess.Popen[str]] = None

    def state(self, *args: str, stdin: Optional[str] = None) -> Tuple[int, str, str]:
        """``meltano state ARGS``, in a process forked from one that has
        imported Meltano already (meltano_forks.py), in this project with its
        environment."""
        if self.forks is None:
            self.forks = subprocess.Popen(
                [sys.executable, str(HERE / "meltano_forks.py")], cwd=self.root,
                env={**self.env, "EDITOR": self.editor}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True,
            )
        assert self.forks.stdin and self.forks.stdout
        self.forks.stdin.write(json.dumps({"args": ["state", *args], "stdin": stdin}) + "\n")
        self.forks.stdin.flush()
        ready, _, _ = select.select([self.forks.stdout], [], [], MELTANO_BOUND_S)
        assert ready, f"`meltano state {' '.join(args)}` did not end within {MELTANO_BOUND_S} s"
        answer = json.loads(self.forks.stdout.readline())
        return answer["code"], answer["stdout"], answer["stderr"]

    def close(self) -> None:
        if self.forks is not None:
            self.forks.kill()
            self.forks.wait()


def base_env(extra: Dict[str, str]) -> Dict[str, str]:
    import os

    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLOCK_", "MELTANO_", "AWS_"))}
    # COLUMNS: a failure's traceback wide enough to read.
    return {
        **keep, "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false", "MELTANO_DISABLE_TRACKING": "true",
        "COLUMNS": "200", **extra,
    }


def files_under(root: Path) -> Dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def s3_objects(bucket: str) -> Dict[str, str]:
    import boto3

    import os

    client = boto3.client(
        "s3", endpoint_url=os.environ["RUNLOCK_TEST_S3_ENDPOINT"],
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1",
    )
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read().decode() for key in sorted(keys)}


STATE_ROWS = "SELECT state_id, partial_state, completed_state FROM state ORDER BY state_id"


def sqlite_rows(db: Path) -> List[Tuple[str, object, object]]:
    conn = sqlite3.connect(db)
    try:
        return [(sid, json.loads(p) if p else p, json.loads(c) if c else c) for sid, p, c in conn.execute(STATE_ROWS)]
    finally:
        conn.close()


def pg_rows(uri: str) -> List[Tuple[str, object, object]]:
    import psycopg

    with psycopg.connect(uri.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        rows = conn.execute(STATE_ROWS).fetchall()
    return [(sid, p if not isinstance(p, str) else json.loads(p), c if not isinstance(c, str) else json.loads(c)) for sid, p, c in rows]


def pair(kind: str, workdir: Path) -> Tuple[Project, Snapshot, Project, Snapshot]:
    """The plain project and its store's raw contents, then the runlock+ one's."""
    import os

    made = []
    for name in ("plain", "runlock"):
        prefix = "runlock+" if name == "runlock" else ""
        extra = ""
        extra_settings = ""
        snapshot: Snapshot
        if kind == "file":
            where = workdir / f"{name}-state"
            uri = f"{prefix}file://{where}"
            snapshot = lambda where=where: files_under(where)  # noqa: E731
        elif kind == "s3":
            bucket = s3_bucket()
            uri = f"{prefix}s3://{bucket}/state"
            endpoint = os.environ["RUNLOCK_TEST_S3_ENDPOINT"]
            extra_settings = (
                f"  s3:\n    endpoint_url: {endpoint}\n    aws_access_key_id: test\n    aws_secret_access_key: test\n"
            )
            snapshot = lambda bucket=bucket: s3_objects(bucket)  # noqa: E731
        elif kind == "dummy":
            # A third party's store (tests/fixtures/dummy_state_backend), with
            # its setting; its journal of locks and writes is compared too.
            where = workdir / f"{name}-state"
            uri = f"{prefix}dummy://{where}"
            extra_settings = "  dummy:\n    suffix: .state\n"
            snapshot = lambda where=where: files_under(where)  # noqa: E731
        elif kind == "sqlite":
            uri = "runlock+systemdb://" if prefix else "systemdb"
            db = workdir / name / ".meltano" / "meltano.db"
            snapshot = lambda db=db: sqlite_rows(db)  # noqa: E731
        else:
            uri = "runlock+systemdb://" if prefix else "systemdb"
            database = pg_database()
            extra = f"database_uri: {database}\n"
            snapshot = lambda database=database: pg_rows(database)  # noqa: E731
        project = Project(workdir / name, uri, extra)
        if extra_settings:
            with open(project.root / "meltano.yml", "a") as handle:
                handle.write(extra_settings)
        made.append((project, snapshot))
    (plain, plain_snapshot), (locked, locked_snapshot) = made
    return plain, plain_snapshot, locked, locked_snapshot


# The same existing state in both, then every subcommand with its forms.
SETUP: List[List[str]] = [
    ["set", "--force", "alpha", '{"singer_state": {"old": 1}}'],
    ["set", "--force", "beta", '{"singer_state": {"b": 1}}'],
    ["merge", "beta", '{"singer_state": {"p": 1}}'],
]

IMPORTED = {
    # The case: a partial state imported over a completed one replaces it.
    "alpha": {"completed": {}, "partial": {"singer_state": {"new": 2}}},
    "zeta": {"completed": {"singer_state": {"z": 1}}, "partial": {}},
}

STEPS: List[Tuple[List[str], Optional[str]]] = [
    (["get", "alpha"], None),
    (["get", "beta", "--format", "pretty"], None),
    (["list"], None),
    (["list", "--pattern", "b*"], None),
    (["set", "--force", "alpha", '{"singer_state": {"a": 2}}'], None),
    (["merge", "beta", '{"singer_state": {"m": 3}}'], None),
    (["merge", "gamma", "--from-state-id", "beta"], None),
    (["copy", "--force", "alpha", "delta"], None),
    (["move", "--force", "delta", "epsilon"], None),
    (["clear", "--force", "beta"], None),
    (["clear", "--force", "never-set"], None),
    (["edit", "--force", "alpha"], None),
    (["export"], None),
    (["import"], json.dumps(IMPORTED)),
    (["get", "alpha"], None),
    (["export"], None),
    (["clear", "--force", "--all"], None),
    (["list"], None),
]


def same_output(args: List[str], plain: str, locked: str) -> None:
    if args[0] == "list":  # the order of a store's listing is its own
        assert sorted(plain.splitlines()) == sorted(locked.splitlines()), (plain, locked)
    elif args[0] in ("get", "export"):
        assert json.loads(plain) == json.loads(locked), (plain, locked)
    else:
        assert plain == locked, (plain, locked)


@pytest.fixture
def agent(runlockd: Path, workdir: Path) -> Iterator[Agent]:
    with Agent(runlockd, workdir, "memory://") as started:
        yield started


@pytest.mark.parametrize("kind", ["file", "s3", "dummy", "sqlite", "postgres"])
def test_each_state_subcommand_leaves_what_the_plain_backend_leaves(kind: str, agent: Agent, workdir: Path) -> None:
    plain, plain_snapshot, locked, locked_snapshot = pair(kind, workdir)
    plain.env = base_env({})
    locked.env = base_env({"RUNLOCK_SOCKET": agent.socket})

    def both(args: List[str], stdin: Optional[str]) -> Tuple[Tuple[int, str, str], Tuple[int, str, str]]:
        with ThreadPoolExecutor(2) as pool:
            a = pool.submit(plain.state, *args, stdin=stdin)
            b = pool.submit(locked.state, *args, stdin=stdin)
            return a.result(), b.result()

    try:
        for args in SETUP:
            (code_a, _, err_a), (code_b, _, err_b) = both(args, None)
            assert code_a == 0 and code_b == 0, (args, err_a, err_b)
        assert plain_snapshot() == locked_snapshot()
        assert plain_snapshot(), "no existing state"
        if kind == "dummy":
            # The store's setting reached it through the add-on: its files' suffix.
            assert "alpha.state" in locked_snapshot(), locked_snapshot()

        for args, stdin in STEPS:
            (code_a, out_a, err_a), (code_b, out_b, err_b) = both(args, stdin)
            assert code_a == 0, f"plain `meltano state {' '.join(args)}`: {err_a[-3000:]}"
            assert code_b == 0, f"runlock+ `meltano state {' '.join(args)}`: {err_b[-3000:]}"
            same_output(args, out_a, out_b)
            assert plain_snapshot() == locked_snapshot(), f"after `meltano state {' '.join(args)}`"
    finally:
        plain.close()
        locked.close()
    # The runlock+ project did go through the add-on: its state locks.
    assert "acquired key=meltano-state-write:alpha " in agent.log(), agent.log()

