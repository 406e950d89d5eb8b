"""A ``meltano`` that starts at once, for tests that run hundreds of commands.

Started with a project's directory and environment, this process imports
Meltano's CLI once; then, for each JSON line on its stdin (``{"args": [...],
"stdin": "..." or null}``), it forks, runs ``meltano ARGS`` in the child, and
answers with a JSON line (``{"code", "stdout", "stderr"}``). The child is a
``meltano`` process in all but the imports, which were most of the ~1.7 s of
CPU each command took (test_state_commands.py runs 168 of them): Meltano's
CLI, and what a command imports as it runs (every state backend's modules,
when it looks up the add-ons), which the child names and this process then
imports too, for the next.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import tempfile
import traceback
from typing import Dict, List, Optional

from meltano.cli import main


def exit_code(exit: SystemExit) -> int:
    """The status ``sys.exit(main())`` gives the real ``meltano`` script."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    return 1


def run(args: List[str], stdin: Optional[str]) -> Dict[str, object]:
    with tempfile.TemporaryFile() as given, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryFile() as imported:
        given.write((stdin or "").encode())
        given.seek(0)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            known = set(sys.modules)
            try:
                for fd, file in ((0, given), (1, out), (2, err)):
                    os.dup2(file.fileno(), fd)
                # New streams on the new descriptors: nothing the parent buffered carries over.
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                sys.argv = ["meltano", *args]
                main()
                code = 0
            except SystemExit as exit:
                code = exit_code(exit)
            except BaseException:
                traceback.print_exc()
            finally:
                # What the interpreter's own exit would do, then no return into this loop.
                atexit._run_exitfuncs()
                imported.write("\n".join(sorted(set(sys.modules) - known)).encode())
                imported.flush()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        imported.seek(0)
        learn(imported.read().decode().split())
        out.seek(0)
        err.seek(0)
        return {
            "code": os.waitstatus_to_exitcode(status),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def learn(modules: List[str]) -> None:
    """Imports what a child imported, so that the next child has it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # one that only imports in its own context (a package's private alias, say)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        answer = run(request["args"], request.get("stdin"))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
