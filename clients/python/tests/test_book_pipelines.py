"""The book's "Running pipelines" snippets, as printed, against a real runlockd.

The Python blocks are taken from docs/src/pipelines.md and run as they stand, with one
substitution: the project directory `/srv/meltano/project` becomes a scratch
project. `meltano` is a stand-in on PATH that records what it was given (the
shim and the client are real). Airflow, Dagster and Prefect are not installed:
each snippet gets a module named after the orchestrator that provides the one
name it imports (`BashOperator` keeps its arguments, `op` and `flow` return
the function, `Failure` is an exception), so what is checked is what runlock
does inside them: the lock, the token and descriptors handed to the work, the
exception a held key raises, and the exit status Airflow is told to skip on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

import runlock
from conftest import REPO
from runlock.testing import Agent

#: Every command the test runs must end within this.
BOUND_S = 30.0
BOOK_PROJECT = "/srv/meltano/project"
PIPELINES = REPO / "docs" / "src" / "pipelines.md"
KEY = "prod:tap-gitlab-to-target-postgres"

FAKE_MELTANO = """#!/usr/bin/env python3
import json, os, sys
opened = []
for fd in os.listdir("/proc/self/fd"):
    try:
        opened.append(os.readlink("/proc/self/fd/" + fd))
    except OSError:
        pass  # the listing's own descriptor, closed by now
with open(os.path.join(os.getcwd(), "meltano-ran.json"), "w") as out:
    json.dump({"argv": sys.argv[1:], "token": os.environ.get("RUNLOCK_TOKEN"), "opened": opened}, out)
"""

#: The project the deployment examples run too; its default environment is
#: dev, so the test chooses prod as a deployment does (MELTANO_ENVIRONMENT).
PROJECT = REPO / "tests" / "fixtures" / "meltano.yml"


def pipeline_blocks() -> List[str]:
    """The ```python blocks of the book's "Running pipelines" chapter, in order."""
    return re.findall(r"```python\n(.*?)```", PIPELINES.read_text(), flags=re.S)


@pytest.fixture
def project(agent: Agent, runlockd: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch Meltano project, the stand-in `meltano` and the real `runlock`
    on PATH, RUNLOCK_SOCKET naming the test's agent, and MELTANO_ENVIRONMENT=prod."""
    root = Path(agent.socket).parent / "project"
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(PROJECT, root / "meltano.yml")
    meltano = bin_dir / "meltano"
    meltano.write_text(FAKE_MELTANO)
    meltano.chmod(0o755)
    shim = runlockd.parent / "runlock"
    assert shim.is_file(), f"no runlock beside {runlockd}"
    (bin_dir / "runlock").symlink_to(shim)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RUNLOCK_SOCKET", agent.socket)
    monkeypatch.setenv("MELTANO_ENVIRONMENT", "prod")
    yield root


def run_block(source: str, project: Path, modules: Dict[str, types.ModuleType]) -> Dict[str, Any]:
    """Executes one block of the chapter in a fresh namespace, with `modules`
    importable for the duration, and returns its namespace."""
    source = source.replace(BOOK_PROJECT, str(project))
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        namespace: Dict[str, Any] = {"__name__": "pipeline_snippet"}
        exec(compile(source, str(PIPELINES.relative_to(REPO)), "exec"), namespace)
        return namespace
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def module(name: str, **names: Any) -> types.ModuleType:
    made = types.ModuleType(name)
    for attribute, value in names.items():
        setattr(made, attribute, value)
    return made


def identity(*args: Any, **kwargs: Any) -> Any:
    """`@op` and `@flow(retries=0)` alike: the decorated function itself."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda function: function


def ran(project: Path) -> Dict[str, Any]:
    record = project / "meltano-ran.json"
    assert record.is_file(), "the pipeline's meltano did not run"
    loaded: Dict[str, Any] = json.loads(record.read_text())
    return loaded


def test_book_has_the_four_pipeline_blocks() -> None:
    blocks = pipeline_blocks()
    assert len(blocks) == 3, blocks  # Airflow; meltano_run; Dagster and Prefect
    assert "BashOperator(" in blocks[0]
    assert "def meltano_run(" in blocks[1]
    assert "from dagster import" in blocks[2] and "from prefect import" in blocks[2]


def test_airflow_bash_command_runs_locked_and_exits_as_skipped_when_held(
    agent: Agent, project: Path
) -> None:
    operators: List[Dict[str, Any]] = []
    bash = module("airflow.operators.bash", BashOperator=lambda **kw: operators.append(kw))
    run_block(pipeline_blocks()[0], project, {
        "airflow": module("airflow"),
        "airflow.operators": module("airflow.operators"),
        "airflow.operators.bash": bash,
    })
    [task] = operators
    assert task["append_env"] is True
    env = {**os.environ, **task["env"], "RUNLOCK_SOCKET": agent.socket}

    def bash_command() -> "subprocess.CompletedProcess[str]":
        return subprocess.run(["bash", "-c", task["bash_command"]], env=env,
                              capture_output=True, text=True, timeout=BOUND_S)

    free = bash_command()
    assert free.returncode == 0, free.stderr
    assert ran(project)["argv"] == ["run", "tap-gitlab", "target-postgres"]
    assert int(ran(project)["token"]) >= 1
    (project / "meltano-ran.json").unlink()

    with runlock.lock(KEY, socket=agent.socket):
        held = bash_command()
    assert held.returncode == task["skip_on_exit_code"], held.stderr
    assert not (project / "meltano-ran.json").exists()


def test_meltano_run_hands_the_token_and_lock_descriptors_to_meltano(
    agent: Agent, project: Path
) -> None:
    meltano_run: Callable[..., None] = run_block(pipeline_blocks()[1], project, {})["meltano_run"]
    meltano_run(KEY, "tap-gitlab", "target-postgres")
    record = ran(project)
    assert record["argv"] == ["run", "tap-gitlab", "target-postgres"]
    after = runlock.inspect(KEY, socket=agent.socket)
    assert after.state == "free"
    assert int(record["token"]) == after.token
    # On file:// the key's kernel lock rode along, so the key stays locked
    # while meltano runs even without an agent; memory:// has none to pass.
    locks_dir = agent.backend[len("file://"):] if agent.backend.startswith("file://") else None
    lock_files = [path for path in record["opened"] if locks_dir and path.startswith(locks_dir)]
    assert bool(lock_files) == bool(locks_dir), record


def test_dagster_op_fails_naming_the_holder(agent: Agent, project: Path) -> None:
    class Failure(Exception):
        pass

    dagster_part = pipeline_blocks()[2].split("# Prefect", 1)[0]
    namespace = run_block(pipeline_blocks()[1] + dagster_part, project,
                          {"dagster": module("dagster", op=identity, Failure=Failure)})
    op = namespace["tap_gitlab_to_target_postgres"]

    op()
    assert ran(project)["argv"] == ["run", "tap-gitlab", "target-postgres"]
    (project / "meltano-ran.json").unlink()

    with runlock.lock(KEY, socket=agent.socket):
        with pytest.raises(Failure, match="another run holds the key") as failed:
            op()
    assert isinstance(failed.value.__cause__, runlock.Held)
    # The holder as the shim's exit-75 message names it, a field a line.
    assert f"\n  pid:     {os.getpid()}\n" in str(failed.value), failed.value
    assert not (project / "meltano-ran.json").exists()


def test_prefect_flow_runs_the_pipeline_locked(agent: Agent, project: Path) -> None:
    prefect_part = "from prefect import" + pipeline_blocks()[2].split("from prefect import", 1)[1]
    namespace = run_block(pipeline_blocks()[1] + prefect_part, project,
                          {"prefect": module("prefect", flow=identity)})
    flow = namespace["tap_gitlab_to_target_postgres"]

    flow()
    assert int(ran(project)["token"]) == runlock.inspect(KEY, socket=agent.socket).token
    with runlock.lock(KEY, socket=agent.socket):
        with pytest.raises(runlock.Held):
            flow()
