"""The state backend Meltano loads for ``runlock+SCHEME://…`` URIs (entry
points in pyproject.toml): Meltano's own store for SCHEME does the storing;
this adds the run lock, the state lock and the fence on writes.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from meltano.core.state_store.base import MeltanoState, StateStoreManager
from meltano.core.state_store.db import DBStateStoreManager
from meltano.core.state_store.filesystem import BaseFilesystemStateStoreManager

from . import fence
from .building import meltanos_manager
from .runs import RUN_LOCKS, RunLocks
from .state_lock import state_lock


class RunlockStateStoreManager(StateStoreManager):
    """``state_backend.uri: runlock+s3://bucket/prefix`` (or file, gs, azure,
    systemdb, or any state backend installed: ``runlock+NAME://…``), around
    ``inner``, the manager Meltano built for the URI after ``runlock+``
    (building.py). Without ``inner`` (Meltano called the entry point itself,
    with settings alone), it is built as Meltano builds it, from the active
    project's settings, without a session.

    ``owns_session``: the system database session of ``inner`` was opened by
    Meltano for this store alone (none was handed to it), and is closed with
    it."""

    def __init__(
        self,
        uri: str,
        *,
        inner: StateStoreManager | None = None,
        runs: RunLocks | None = None,
        owns_session: bool = False,
        **settings: t.Any,
    ):
        super().__init__()
        self.uri = uri
        self._owns_session = owns_session or inner is None
        self.inner = inner if inner is not None else meltanos_manager(uri)
        self.runs = runs if runs is not None else RUN_LOCKS
        self.fence = fence.for_store(self.inner)
        self._registered: set[str] = set()

    # It answers as the store it wraps to whoever asks which store it is, or
    # for the store's own attributes (``isinstance(m, S3StateStoreManager)``,
    # ``m.bucket``, ``m.session``), as Meltano's own tests do: only the
    # operations of a state store manager, defined here, are runlock's.

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.inner)

    def __getattr__(self, name: str) -> t.Any:
        # Called only for what this class does not define; ``inner`` itself
        # is missing only while __init__ runs.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def label(self) -> str:
        return f"{self.inner.label}, locked by runlock"

    def _enter(self, state_id: str) -> None:
        """This run's lock on ``state_id`` (taken as Meltano started the job,
        job_start.py, unless that hook could not be installed), and its token
        recorded in the state store at its first touch, so that the store
        refuses the writes of the run it took over."""
        held = self.runs.ensure(state_id)
        if held is None or held.token is None or state_id in self._registered:
            return
        token = held.token
        self.fence.register(state_id, token, lambda recorded: self.runs.overtaken(state_id, token, recorded))
        self._registered.add(state_id)

    def get(self, state_id: str) -> MeltanoState | None:
        self._enter(state_id)
        return self.inner.get(state_id)

    def set(self, state: MeltanoState) -> None:
        held = self.runs.fence(state.state_id)
        if held is None or held.token is None:
            self.fence.write(state, None, _not_a_run)
            return
        token = held.token
        self.fence.write(state, token, lambda recorded: self.runs.overtaken(state.state_id, token, recorded))
        self._registered.add(state.state_id)

    def delete(self, state_id: str) -> None:
        self.runs.fence(state_id)
        self.fence.delete(state_id)

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        return self.inner.get_state_ids(pattern)

    # The bulk operations (`meltano state export`, `import`, `clear --all`;
    # no run makes them) are Meltano's store's own, so that they do what they
    # do without the add-on: the system database's import replaces each
    # state, where a write of one state merges a partial state into it.

    def get_all(self, pattern: str | None = None) -> Iterable[MeltanoState]:
        return self.inner.get_all(pattern)

    def set_all(self, states: Iterable[MeltanoState]) -> int:
        return self.fence.write_all(states)

    def clear_all(self) -> int:
        if type(self.inner).clear_all is StateStoreManager.clear_all:
            # The store has no bulk delete: Meltano's own loop of `clear`, so
            # each delete under the state lock, runlock's here.
            return super().clear_all()
        return self.inner.clear_all()

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float) -> Iterator[None]:
        # The run lock first, so that a run that writes before it reads is
        # refused as a duplicate run, not queued behind a state write.
        self._enter(state_id)
        if not self.fence.meltanos_own:
            # An add-on's store: runlock's lock, then the store's own, which
            # may do what the store needs done (and keeps out its writers
            # without the add-on).
            with state_lock(state_id), self.inner.acquire_lock(state_id, retry_seconds=retry_seconds):
                yield
            return
        if isinstance(self.inner, BaseFilesystemStateStoreManager):
            # As Meltano's own acquire_lock, which this one replaces: deleting
            # a local state ID removes its directory, which must exist.
            self.inner.create_state_id_dir_if_not_exists(state_id)
        with state_lock(state_id):
            yield

    def migrate(self) -> None:
        self.inner.migrate()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            if self._owns_session and isinstance(self.inner, DBStateStoreManager):
                self.inner.session.close()


def _not_a_run(recorded: int) -> None:
    """Never called: a write that is no run's keeps the token it finds (fence.decide)."""
