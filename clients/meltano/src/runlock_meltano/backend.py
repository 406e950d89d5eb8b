"""The state backend Meltano loads for ``runlock+SCHEME://…`` URIs (entry
points in pyproject.toml): Meltano's own store for SCHEME does the storing;
this adds the run lock, the state lock and the fence on writes.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from meltano.core.state_store.base import MeltanoState, StateStoreManager
from meltano.core.state_store.filesystem import BaseFilesystemStateStoreManager

from .inner import open_inner
from .runs import RUN_LOCKS, RunLocks
from .state_lock import state_lock


class RunlockStateStoreManager(StateStoreManager):
    """``state_backend.uri: runlock+s3://bucket/prefix`` (or file, gs, azure, systemdb)."""

    def __init__(
        self,
        uri: str,
        *,
        inner: StateStoreManager | None = None,
        runs: RunLocks | None = None,
        **settings: t.Any,
    ):
        super().__init__()
        self.uri = uri
        self.inner = inner if inner is not None else open_inner(uri, settings)
        self.runs = runs if runs is not None else RUN_LOCKS

    @property
    def label(self) -> str:
        return f"{self.inner.label}, locked by runlock"

    def get(self, state_id: str) -> MeltanoState | None:
        # The run lock is taken as Meltano starts the job (job_start.py); here
        # it is already held, unless that hook could not be installed.
        self.runs.ensure(state_id)
        return self.inner.get(state_id)

    def set(self, state: MeltanoState) -> None:
        if isinstance(self.inner, BaseFilesystemStateStoreManager):
            # Meltano's own acquire_lock makes a local store's directory; this one does not run.
            self.inner.create_state_id_dir_if_not_exists(state.state_id)
        self.runs.fence(state.state_id)
        self.inner.set(state)

    def delete(self, state_id: str) -> None:
        self.runs.fence(state_id)
        self.inner.delete(state_id)

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        return self.inner.get_state_ids(pattern)

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float) -> Iterator[None]:
        # The run lock first, so that a run that writes before it reads is
        # refused as a duplicate run, not queued behind a state write.
        self.runs.ensure(state_id)
        with state_lock(state_id):
            yield

    def migrate(self) -> None:
        self.inner.migrate()

    def close(self) -> None:
        self.inner.close()
