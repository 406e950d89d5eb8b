"""The run lock, taken when Meltano starts an extract-load job.

Both of Meltano's extract-load paths (``meltano run``'s blocks and ``meltano
el``/``elt``) run under ``async with job.run(session)`` on Meltano's ``Job``,
whose ``job_name`` is the state ID, before any plugin starts. Locking the
state ID there locks every run before its tap starts, whether it reads state
or not (``--full-refresh``, an extractor without the ``state`` capability, a
``--state`` file). A state backend is not told when a run starts, so the
add-on wraps ``Job.run`` when it is imported, which Meltano does at start-up
for every command (the add-on's setting, settings.py). Should ``Job.run``
not be what this was written against (Meltano 4.4), nothing is wrapped and
the run lock is taken at the state ID's first state access, as the state
backend does anyway.
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing as t
from contextlib import AbstractAsyncContextManager

from . import settings
from .inner import PREFIX

_log = logging.getLogger("runlock_meltano")

#: Set on the wrapper, to Meltano's own ``Job.run``: how a second install knows.
ORIGINAL = "_runlock_original"

JobRun = t.Callable[[t.Any, t.Any], AbstractAsyncContextManager[None]]


def install(job_class: type | None = None) -> bool:
    """Wraps ``job_class.run`` (Meltano's ``Job``) once, however often it is
    called. False, leaving it as it is, when it is not the
    ``@asynccontextmanager`` method ``run(self, session)`` expected."""
    if job_class is None:
        try:
            from meltano.core.job.job import Job
        except ImportError as err:
            _log.debug("runlock: no Meltano Job to hook (%s); runs are locked at their first state access", err)
            return False
        job_class = Job
    current = getattr(job_class, "run", None)
    if hasattr(current, ORIGINAL):
        return True
    if not _is_job_run(current):
        _log.debug("runlock: Meltano's Job.run is not the one expected; runs are locked at their first state access")
        return False
    setattr(job_class, "run", locking(t.cast(JobRun, current)))
    return True


def _is_job_run(method: object) -> bool:
    # @asynccontextmanager keeps the generator function it decorates here.
    generator = getattr(method, "__wrapped__", None)
    if not inspect.isasyncgenfunction(generator):
        return False
    return list(inspect.signature(generator).parameters) == ["self", "session"]


def locking(original: JobRun) -> JobRun:
    """``original`` preceded by this run's lock on the job's state ID, when
    the project's state backend is a ``runlock+`` one (:meth:`RunLocks.ensure`
    decides the rest: the command, ``--force``, the shim around, the policy)."""

    @functools.wraps(original)
    def run(job: t.Any, session: t.Any) -> AbstractAsyncContextManager[None]:
        uri = settings.state_backend_uri()
        if uri is not None and uri.startswith(PREFIX):
            # Here, not with this module: Meltano imports it for every command.
            from . import runs
            from .errors import RunHeld

            # Raises RunHeld before Meltano marks the job running, so a refused
            # run leaves no job behind in the system database, and Meltano's
            # CLI ends with RunHeld's exit status (75: skipped).
            try:
                runs.RUN_LOCKS.ensure(job.job_name)
            except RunHeld as held:
                held.log_without_traceback()
                raise
        return original(job, session)

    setattr(run, ORIGINAL, original)
    return run
