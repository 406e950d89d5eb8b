"""Meltano's own state tests, run plainly and through the add-on, compared.

    python compare.py SDIST_DIR

runs the test paths of :data:`PATHS` in Meltano's unpacked sdist twice, at
once: plainly, and with ``runlock+`` in front of every state backend URI
(runlock_substitution.py) against a real runlockd on ``memory://`` (``$RUNLOCKD``,
else this workspace's debug build). Each test's
outcome (runlock_outcomes.py) must be the same in both, but for the tests of
:data:`REPLACED_BY_DESIGN`, which look for Meltano's own lock file: runlock
takes that lock instead (the add-on's ``acquire_lock``). The plain run must
pass as Meltano's own CI has it pass, and the substituted one must have gone
through the add-on (its managers substituted both ways, state-write leases
granted by the agent). Exits 0 when all holds, else 1, saying why.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runlock.testing import Agent, runlockd

import runlock_outcomes

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent

#: Meltano's state tests: its state stores, `meltano state`, its StateService.
PATHS = (
    "tests/meltano/core/state_store/",
    "tests/meltano/cli/test_state.py",
    "tests/meltano/core/test_state_service.py",
)

#: They assert that Meltano's own lock file is there while its lock is held.
REPLACED_BY_DESIGN = {
    "tests/meltano/core/state_store/test_filesystem.py::TestLocalFilesystemStateStoreManager::test_acquire_lock",
    "tests/meltano/core/state_store/test_filesystem.py::TestLocalFilesystemStateStoreManager::test_lock_timeout",
}

#: What a plain run of Meltano's tests may end with.
PLAIN_OK = {"passed", "xfailed", "skipped"}

#: Bounds each run (both at once take 2 to 4 minutes on a busy 2-core host).
RUN_BOUND_S = 900

# Each run is one pytest process, the two at once. pytest-xdist made it
# slower on 2 cores: two workers per run took 142 s where this took 108 s
# (load average 12), each worker importing Meltano and its fixtures again.


def start(name: str, sdist: Path, work: Path, env: dict[str, str], plugins: list[str]) -> tuple[subprocess.Popen[bytes], Path, Path]:
    result = work / f"{name}.jsonl"
    log = work / f"{name}.log"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "runlock_outcomes"]
    for plugin in plugins:
        argv += ["-p", plugin]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, *PATHS], cwd=sdist, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**env, "RUNLOCK_OWN_TESTS_OUTCOMES": str(result)},
        )
    return proc, result, log


def counts(results: dict[str, str]) -> str:
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(collections.Counter(results.values()).items()))


def main(sdist: Path) -> int:
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="runlock-own-", dir="/tmp") as tmp:
        work = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOCK_")}
        path = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        base["PYTHONPATH"] = path
        substituted_counts = work / "substituted-counts.jsonl"
        started = time.monotonic()
        with Agent(runlockd(REPO), work, "memory://") as agent:
            runlock_env = {
                **base,
                "RUNLOCK_SOCKET": agent.socket,
                "RUNLOCK_CONFIG": str(work / "none.toml"),
                "RUNLOCK_OWN_TESTS_SUBSTITUTED": str(substituted_counts),
            }
            runs = {
                "plain": start("plain", sdist, work, base, []),
                "runlock": start("runlock", sdist, work, runlock_env, ["runlock_substitution"]),
            }
            results: dict[str, dict[str, str]] = {}
            for name, (proc, result, log) in runs.items():
                try:
                    proc.wait(timeout=RUN_BOUND_S - (time.monotonic() - started))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    problems.append(f"the {name} run did not end within {RUN_BOUND_S} s")
                if not result.exists():
                    print(log.read_text(errors="replace"), file=sys.stderr)
                    problems.append(f"the {name} run recorded no outcomes (exit {proc.returncode}); its log is above")
                    continue
                results[name] = runlock_outcomes.read(str(result))
            agent_log = agent.log()
        took = time.monotonic() - started

        if len(results) == 2:
            plain, through = results["plain"], results["runlock"]
            print(f"Meltano's state tests ({', '.join(PATHS)}), both runs at once, {took:.0f} s:")
            print(f"  plain:        {len(plain)} tests: {counts(plain)}")
            print(f"  runlock+URI:  {len(through)} tests: {counts(through)}")
            for test in sorted(set(plain) | set(through)):
                a, b = plain.get(test, "not run"), through.get(test, "not run")
                if a != b:
                    allowed = test in REPLACED_BY_DESIGN and a == "passed" and b == "failed"
                    print(f"  {'replaced by design' if allowed else 'DIFFERENT'}: {test}: plain {a}, runlock+ {b}")
                    if not allowed:
                        problems.append(f"{test}: plain {a}, through runlock {b}")
            failed_plain = sorted(t for t, o in plain.items() if o not in PLAIN_OK)
            if failed_plain:
                problems.append(f"the plain run failed, so it proves nothing: {', '.join(failed_plain)}")
            if not plain:
                problems.append("no test ran")
            # The substitution took effect: the lock file tests see runlock's lock instead.
            for test in sorted(REPLACED_BY_DESIGN):
                if through.get(test) != "failed":
                    problems.append(f"{test} did not see runlock's lock in place of Meltano's (substitution not in effect?)")

        ways: collections.Counter[str] = collections.Counter()
        if substituted_counts.exists():
            for line in substituted_counts.read_text().splitlines():
                ways.update(json.loads(line))
        print(f"  managers through the add-on: {ways['settings']} from the state_backend.uri setting, "
              f"{ways['fixtures']} from fixtures")
        if not (ways["settings"] and ways["fixtures"]):
            problems.append(f"the add-on was not substituted both ways: {dict(ways)}")
        leases = agent_log.count("acquired key=meltano-state-write:")
        print(f"  state-write leases granted by runlockd: {leases}")
        if not leases:
            problems.append("runlockd granted no state-write lease: the state writes did not go through the add-on")

        if problems:
            for _, _, log in runs.values():
                print(f"-- {log.name}, its end:", file=sys.stderr)
                print(log.read_text(errors="replace")[-20000:], file=sys.stderr)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    sys.exit(main(Path(sys.argv[1])))
