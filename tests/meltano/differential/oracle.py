"""Meltano's own answer for a shape, from Meltano 4.4.1's own code.

Run with the Python of Meltano's venv. It imports Meltano once, then for
each JSON request line on stdin forks a child that sets up the shape (its
directory, exactly its process environment) and asks Meltano, and writes one
JSON answer line to stdout:

- ``{"kind": "cli", "id", "cwd", "env", "args"}``: runs ``meltano ARGS``
  through Meltano's CLI and answers ``{"id", "code", "stderr", "state_ids"}``,
  the state IDs being every ``job_name`` a ``Job`` was created with (the
  state ID of each ``run`` block set, and of ``el``/``elt``), in order.
- ``{"kind": "settings", "id", "cwd", "env", "names"}``: answers
  ``{"id", "code", "stderr", "settings": {name: [value, store, variable]}}``
  from ``ProjectSettingsService.get_with_metadata`` (what ``get_with_source``
  reads, and the variable an env store found it in) of the project found
  from cwd.

A child's output goes to temporary files, never to this process's stdout,
so the answers stay one JSON line each. Modules a child imported are then
imported here too (``meltano_forks.learn``), so the next child has them.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

# The add-on's tests hold the fork-per-command runner this one shares its
# exit-code rule and its import learning with.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients" / "meltano" / "tests"))

import meltano_forks  # noqa: E402
from meltano.cli import main  # noqa: E402
from meltano.core.job.job import Job  # noqa: E402
from meltano.core.project import Project  # noqa: E402
from sqlalchemy import event  # noqa: E402

CHILD_SECONDS = 60

# Where the running child appends each state ID it forms; set before each fork.
_state_id_file: List[str] = [""]


@event.listens_for(Job, "init")
def _record_state_id(_job: Job, _args: Any, kwargs: Dict[str, Any]) -> None:
    """Every Job Meltano creates for a run names its state ID as ``job_name``."""
    if _state_id_file[0] and "job_name" in kwargs:
        with open(_state_id_file[0], "a", encoding="utf-8") as ids:
            ids.write(json.dumps(kwargs["job_name"]) + "\n")


def in_child(cwd: str, env: Dict[str, str], work: Callable[[], Any]) -> Dict[str, Any]:
    """Runs ``work`` in a forked child in ``cwd`` with exactly ``env``:
    its exit code, its stderr and what it returned (JSON), as a dict."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile() as result, tempfile.TemporaryFile() as imported:
        sys.stdout.flush()
        # Everything imported so far is the child's too: frozen, the child's
        # collector leaves it alone instead of walking (and copying) it.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            code = 1
            known = set(sys.modules)
            try:
                devnull = os.open(os.devnull, os.O_RDONLY)
                for fd, file in ((0, devnull), (1, out.fileno()), (2, err.fileno())):
                    os.dup2(file, fd)
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                # A bound on a child that would hang: SIGALRM ends it.
                signal.alarm(CHILD_SECONDS)
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(env)
                value = work()
                with open(result.name, "w", encoding="utf-8") as answer:
                    json.dump(value, answer)
                code = 0
            except SystemExit as exit:
                code = meltano_forks.exit_code(exit)
            except BaseException:
                traceback.print_exc()
            finally:
                try:
                    imported.write("\n".join(sorted(set(sys.modules) - known)).encode())
                    imported.flush()
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
        imported.seek(0)
        meltano_forks.learn(imported.read().decode().split())
        err.seek(0)
        text = Path(result.name).read_text(encoding="utf-8")
        return {
            "code": os.waitstatus_to_exitcode(status),
            "stderr": err.read().decode(errors="replace"),
            "value": json.loads(text) if text else None,
        }


def meltano_command(args: List[str]) -> Callable[[], Any]:
    def work() -> Any:
        sys.argv = ["meltano", *args]
        main()
        return None

    return work


def settings(names: List[str]) -> Callable[[], Any]:
    def work() -> Any:
        project = Project.find()
        found = {}
        for name in names:
            value, metadata = project.settings.get_with_metadata(name)
            found[name] = [value, metadata["source"].name, metadata.get("env_var")]
        return found

    return work


def answer(request: Dict[str, Any]) -> Dict[str, Any]:
    if request["kind"] == "cli":
        with tempfile.NamedTemporaryFile() as ids:
            _state_id_file[0] = ids.name
            outcome = in_child(request["cwd"], request["env"], meltano_command(request["args"]))
            _state_id_file[0] = ""
            state_ids = [json.loads(line) for line in Path(ids.name).read_text().splitlines()]
        return {"id": request["id"], "code": outcome["code"], "stderr": outcome["stderr"],
                "state_ids": state_ids}
    outcome = in_child(request["cwd"], request["env"], settings(request["names"]))
    return {"id": request["id"], "code": outcome["code"], "stderr": outcome["stderr"],
            "settings": outcome["value"]}


def serve() -> None:
    for line in sys.stdin:
        sys.stdout.write(json.dumps(answer(json.loads(line))) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
