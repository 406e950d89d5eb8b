"""pytest plugin: each test's outcome, as one JSON object per line in the
file ``$RUNLOCK_OWN_TESTS_OUTCOMES`` (``{"test": NODEID, "outcome": …}``),
written once the session ends, by pytest-xdist's controller when it runs.

Outcomes: passed, failed, skipped, xfailed, xpassed, error (its setup or
teardown failed), and ``collection error`` for a file that could not be
collected (under its path)."""

from __future__ import annotations

import json
import os
import typing as t

import pytest

_outcomes: dict[str, str] = {}


def _outcome(report: pytest.TestReport) -> str | None:
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            return "xfailed" if report.skipped else "xpassed"
        return report.outcome
    if report.failed:  # setup or teardown
        return "error"
    if report.when == "setup" and report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = _outcome(report)
    # A teardown's error outranks the call's outcome; nothing else overrides.
    if outcome is not None and (report.nodeid not in _outcomes or outcome == "error"):
        _outcomes[report.nodeid] = outcome


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _outcomes[report.nodeid] = "collection error"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller writes
        return
    path = os.environ["RUNLOCK_OWN_TESTS_OUTCOMES"]
    with open(path, "w", encoding="utf-8") as out:
        for test, outcome in sorted(_outcomes.items()):
            out.write(json.dumps({"test": test, "outcome": outcome}) + "\n")


def read(path: str) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            entry: dict[str, t.Any] = json.loads(line)
            outcomes[entry["test"]] = entry["outcome"]
    return outcomes
