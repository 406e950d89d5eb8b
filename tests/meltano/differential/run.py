"""Differential test of runlock's Meltano key derivation (issue 44, item 2).

For a few hundred generated Meltano projects and command lines (shapes.py),
it asks the installed Meltano 4.4.1 which state IDs the command forms, by
running Meltano's own CLI (oracle.py, one fork per shape), and asks
``runlock run --meltano --print-keys -- meltano ...`` which keys it would
lock, in the same directory with the same process environment; and, for a
few dozen ``state_backend`` placements (backend_shapes.py), compares what
``runlockd check-config --from-meltano`` reads with what Meltano's
``ProjectSettingsService`` reads. compare.py holds the verdicts.

Run it standalone (tests/meltano/differential.rs runs it in CI):

    source tests/scripts/meltano.sh; meltano_install
    cargo build -p runlock-shim -p runlock-agent
    /tmp/runlock-emu/meltano/bin/python tests/meltano/differential/run.py \\
        --runlock target/debug/runlock --runlockd target/debug/runlockd

Options: ``--only TEXT`` (shapes whose id contains TEXT), ``--jobs N``
(Meltano processes; 2 by default), ``--keep`` (keep the shapes' directories
and print where), ``--list`` (print the shapes and exit), ``--answers`` (print Meltano's
answer for every shape, and runlock's if given, and exit 0). It writes the
report (one line per failing shape: id, inputs, command, Meltano's answer,
runlock's answer) to stdout and to /tmp/meltano-diff-report.txt, then a
summary, and exits 1 if any shape failed. ``--summary PATH`` also
writes the counts as JSON (for tests/meltano/differential.rs).
``--meltano-python`` defaults to
the Python beside ``$RUNLOCK_TEST_MELTANO``, else this interpreter.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backend_shapes import NAMES, BackendShape, backend_shapes  # noqa: E402
from compare import Answer, Verdict, backend_verdict, meltano_answer, run_verdict  # noqa: E402
from project_files import substitute, write  # noqa: E402
from shapes import Shape, shapes  # noqa: E402

HERE = Path(__file__).resolve().parent
REPORT = Path("/tmp/meltano-diff-report.txt")
RUNLOCK_SECONDS = 20


def base_env(work: Path) -> Dict[str, str]:
    """What every shape's process environment holds besides its own variables."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work / "home"),
        "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
        "MELTANO_DISABLE_TRACKING": "true",
    }


def shape_env(work: Path, shape_dir: Path, env: Dict[str, str]) -> Dict[str, str]:
    return {**base_env(work), **{k: substitute(val, shape_dir) for k, val in env.items()}}


class Oracle:
    """One oracle.py process in Meltano's venv, asked one shape at a time."""

    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, str(HERE / "oracle.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )

    def ask(self, request: Dict[str, Any]) -> Dict[str, Any]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the oracle exited ({self.process.wait()}) at {request['id']}")
        reply: Dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        assert self.process.stdin
        self.process.stdin.close()
        self.process.wait(timeout=30)


def ask_all(oracles: List[Oracle], requests: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Every request answered, the oracles taking the next one as they finish."""
    pending: "queue.Queue[Dict[str, Any]]" = queue.Queue()
    for request in requests:
        pending.put(request)
    replies: Dict[str, Dict[str, Any]] = {}
    failures: List[BaseException] = []

    def work(oracle: Oracle) -> None:
        try:
            while True:
                try:
                    request = pending.get_nowait()
                except queue.Empty:
                    return
                replies[request["id"]] = oracle.ask(request)
        except BaseException as err:  # reported once every thread is done
            failures.append(err)

    threads = [threading.Thread(target=work, args=(oracle,)) for oracle in oracles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return replies


def run_program(argv: List[str], cwd: Path, env: Dict[str, str]) -> Answer:
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUNLOCK_SECONDS,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Answer(None, "", "")
    return Answer(done.returncode, done.stdout, done.stderr)


def materialize(work: Path, shape_id: str, files: Dict[str, str]) -> Path:
    shape_dir = work / shape_id
    write(shape_dir, {name: substitute(text, shape_dir) for name, text in files.items()})
    return shape_dir


def migrated_database(oracle: Oracle, work: Path) -> Path:
    """A system database Meltano has migrated, copied into every project so
    that no shape pays for the migrations (a third of a shape's time)."""
    template = work / "template"
    write(template, {"meltano.yml": "version: 1\nproject_id: template\n"})
    reply = oracle.ask({"kind": "cli", "id": "template", "cwd": str(template), "env": base_env(work),
                        "args": ["state", "list"]})
    database = template / ".meltano" / "meltano.db"
    if not database.is_file():
        raise RuntimeError(f"Meltano made no system database: {reply['stderr'][-2000:]}")
    return database


def describe(shape: Shape) -> str:
    env = " ".join(f"{k}={v!r}" for k, v in shape.env.items())
    words = shape.launcher + shape.args
    return f"[{shape.summary}] {' '.join(repr(a) if not a or ' ' in a else a for a in words)}" \
           f" (cwd {shape.cwd}{', ' + env if env else ''})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runlock", required=False)
    parser.add_argument("--runlockd", required=False)
    parser.add_argument("--meltano-python", default=None)
    parser.add_argument("--only", default="")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--answers", action="store_true")
    parser.add_argument("--summary", default=None)
    args = parser.parse_args()

    run_shapes = [s for s in shapes() if args.only in s.id]
    settings_shapes = [s for s in backend_shapes() if args.only in f"backend-{s.id}"]
    if args.list:
        for shape in run_shapes:
            print(shape.id, describe(shape), f"refuse={shape.refuse}" if shape.refuse else "")
        for backend in settings_shapes:
            print(f"backend-{backend.id}", backend.summary)
        return 0
    if not args.answers and (not args.runlock or not args.runlockd):
        parser.error("--runlock and --runlockd are required")
    python = args.meltano_python or default_python()
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="meltano-diff-"))
    try:
        (work / "home").mkdir()
        oracles = [Oracle(python) for _ in range(max(1, args.jobs))]
        try:
            verdicts = compare_all(args, oracles, work, run_shapes, settings_shapes)
        finally:
            for oracle in oracles:
                oracle.close()
    finally:
        if args.keep:
            print(f"shapes kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.answers:
        for shape_id, inputs, verdict in verdicts:
            print(f"{shape_id}\t{inputs}\tMeltano: {verdict.meltano}\t{program(shape_id)}: {verdict.runlock}")
        return 0
    return report(verdicts, len(run_shapes), len(settings_shapes), time.monotonic() - started, args.summary)


def default_python() -> str:
    meltano = os.environ.get("RUNLOCK_TEST_MELTANO")
    return str(Path(meltano).parent / "python") if meltano else sys.executable


def compare_all(args: argparse.Namespace, oracles: List[Oracle], work: Path, run_shapes: List[Shape],
                settings_shapes: List[BackendShape]) -> List[Tuple[str, str, Verdict]]:
    dirs = {shape.id: materialize(work, shape.id, shape.files) for shape in run_shapes}
    backend_dirs = {s.id: materialize(work, f"backend-{s.id}", s.files) for s in settings_shapes}

    # runlock's side first (Meltano's writes .meltano/ into the projects).
    def runlock(shape: Shape) -> Answer:
        if not args.runlock:
            return Answer(None, "", "not run")
        shape_dir = dirs[shape.id]
        argv = [args.runlock, "run", "--meltano", "--print-keys", "--", *shape.launcher,
                *(substitute(a, shape_dir) for a in shape.args)]
        return run_program(argv, shape_dir / shape.cwd, shape_env(work, shape_dir, shape.env))

    def runlockd(shape: BackendShape) -> Answer:
        if not args.runlockd:
            return Answer(None, "", "not run")
        shape_dir = backend_dirs[shape.id]
        argv = [args.runlockd, "check-config", "--from-meltano", str(shape_dir / "proj")]
        return run_program(argv, shape_dir, shape_env(work, shape_dir, shape.env))

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runlock_answers = dict(zip((s.id for s in run_shapes), pool.map(runlock, run_shapes)))
        runlockd_answers = dict(zip((s.id for s in settings_shapes), pool.map(runlockd, settings_shapes)))

    database = migrated_database(oracles[0], work)
    for shape_dir in dirs.values():
        for project in shape_dir.rglob("meltano.yml"):
            (project.parent / ".meltano").mkdir(exist_ok=True)
            shutil.copy(database, project.parent / ".meltano" / "meltano.db")

    requests: List[Dict[str, Any]] = []
    for shape in run_shapes:
        shape_dir = dirs[shape.id]
        requests.append({"kind": "cli", "id": shape.id, "cwd": str(shape_dir / shape.cwd),
                         "env": shape_env(work, shape_dir, shape.oracle_env),
                         "args": [substitute(a, shape_dir) for a in shape.oracle_args]})
    for backend in settings_shapes:
        shape_dir = backend_dirs[backend.id]
        requests.append({"kind": "settings", "id": f"backend-{backend.id}", "cwd": str(shape_dir / "proj"),
                         "env": shape_env(work, shape_dir, backend.env), "names": NAMES})
    replies = ask_all(oracles, requests)

    verdicts: List[Tuple[str, str, Verdict]] = []
    for shape in run_shapes:
        melt = meltano_answer(replies[shape.id])
        verdicts.append((shape.id, describe(shape), run_verdict(shape.refuse, melt, runlock_answers[shape.id])))
    for backend in settings_shapes:
        reply = replies[f"backend-{backend.id}"]
        error = None if reply["code"] == 0 else reply["stderr"][-300:]
        verdict = backend_verdict(reply["settings"], error, backend.secrets, runlockd_answers[backend.id])
        verdicts.append((f"backend-{backend.id}", f"[{backend.summary}]", verdict))
    return verdicts


def program(shape_id: str) -> str:
    return "runlockd" if shape_id.startswith("backend-") else "runlock"


def report(verdicts: List[Tuple[str, str, Verdict]], run_count: int, backend_count: int, seconds: float,
           summary: Optional[str]) -> int:
    failures = [(shape_id, inputs, v) for shape_id, inputs, v in verdicts if not v.passed]
    lines = [f"{shape_id}\t{inputs}\tMeltano: {v.meltano}\t{program(shape_id)}: {v.runlock}\t({v.category})"
             for shape_id, inputs, v in failures]
    REPORT.write_text("".join(line + "\n" for line in lines))
    for line in lines:
        print(line)
    passed = collections.Counter(v.category for _, _, v in verdicts if v.passed)
    failed = collections.Counter(v.category for _, _, v in failures)
    backend_failed = sum(1 for shape_id, _, _ in failures if shape_id.startswith("backend-"))
    print(f"\nshapes: {run_count} run/el/elt, {backend_count} state_backend; "
          f"passed {len(verdicts) - len(failures)}, failed {len(failures)} "
          f"({len(failures) - backend_failed} run/el/elt, {backend_failed} state_backend) in {seconds:.0f} s")
    print("passed by category: " + ", ".join(f"{c}: {n}" for c, n in passed.most_common()))
    if failed:
        print("failed by category: " + ", ".join(f"{c}: {n}" for c, n in failed.most_common()))
    print(f"report: {REPORT}")
    if summary:
        Path(summary).write_text(json.dumps({
            "run_shapes": run_count, "backend_shapes": backend_count,
            "failed_run": len(failures) - backend_failed, "failed_backend": backend_failed,
        }))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
