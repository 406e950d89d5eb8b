"""The fence in the state store itself: a run's state write lands only if no
newer run has recorded its token for that state ID in the same store, and
the store, not the add-on, decides it, in the one operation that writes:

- ``file://`` (Meltano's local store): the check of the token recorded in
  ``state.json`` and the write happen under an exclusive ``flock`` of the
  store's directory, which every writer through the add-on takes;
- ``s3://``, ``gs://``, ``azure://``: ``state.json`` carries the token,
  and the write is conditional on the version read with it (S3
  ``If-Match``, GCS ``ifGenerationMatch``, Azure ``If-Match`` on the ETag;
  for a state not yet written, on there being none);
- ``systemdb`` on PostgreSQL or SQLite: a table of its own,
  ``runlock_fence``, keeps each state ID's newest token; one statement
  raises it only when it is not higher than the run's, and Meltano's own
  write of the state follows in the same transaction.

A run records its token when it first touches the state ID (before its tap
starts, as its state is read), so a run taken over by a forced one is
refused as soon as the newer run has started. Other stores (databases
other than PostgreSQL and SQLite, add-ons' stores) keep the agent check
alone (runs.py).

A fence writes the store's objects itself, so it is kept only for Meltano's
own managers, by their exact class: an add-on's manager, even one built on
Meltano's classes, may keep its state otherwise, and is written through its
own ``set`` and ``delete`` only, under its own lock (backend.py).

In ``state.json`` the token is one more key, ``runlock_token``, beside
Meltano's ``completed`` and ``partial``, which Meltano's reader ignores. A
write from a ``meltano state`` command keeps the token it finds; Meltano's
bulk writes (``meltano state import``) and writes without the add-on drop
it, and the next run's write records one again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import sys
import time
import typing as t
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from meltano.core.state_store.base import MeltanoState, StateIDLockedError, StateStoreManager
from meltano.core.state_store.db import DBStateStoreManager
from meltano.core.state_store.filesystem import BaseFilesystemStateStoreManager, LocalFilesystemStateStoreManager

_log = logging.getLogger("runlock_meltano")

#: The key of ``state.json`` that records the token of the newest run that wrote it.
TOKEN_KEY = "runlock_token"

#: How long a writer waits for the local store's lock (held for one read and write).
LOCK_WAIT_S = 30.0

#: Conditional writes retried when another writer got in between (not a newer run).
ATTEMPTS = 20

#: Called with the token a store records when it is higher than the run's.
Overtaken = Callable[[int], None]


def before_store_write(state_id: str) -> None:
    """Called as a run's write is handed to the store's fence: after every
    check the add-on makes, before the one operation in which the store
    decides. The tests replace it to pause a writer there; nothing else does."""


class StoreFence:
    """No fence in the store: writes go to Meltano's store as they are (the
    agent check before them is all). Subclasses make the store decide."""

    def __init__(self, inner: StateStoreManager, *, meltanos_own: bool = True):
        self.inner = inner
        #: Whether ``inner`` is one of Meltano's own stores, whose lock the
        #: add-on's replaces; an add-on's store keeps its own lock as well.
        self.meltanos_own = meltanos_own

    def register(self, state_id: str, token: int, overtaken: Overtaken) -> None:
        """Records ``token`` as the state ID's newest run. ``overtaken(recorded)``
        is called when a higher token is recorded: it raises, or returns to
        have ``token`` recorded all the same."""

    def write(self, state: MeltanoState, token: int | None, overtaken: Overtaken) -> None:
        """Writes ``state`` as Meltano's store would, if no run newer than
        ``token`` (None: not a run) wrote it first."""
        self.inner.set(state)

    def delete(self, state_id: str) -> None:
        self.inner.delete(state_id)

    def write_all(self, states: Iterable[MeltanoState]) -> int:
        return self.inner.set_all(states)


def for_store(inner: StateStoreManager) -> StoreFence:
    """The fence that ``inner``'s store can keep."""
    kind = type(inner)
    if kind is LocalFilesystemStateStoreManager:
        return FileFence(inner)
    # A cloud store's module is imported when its manager exists, and only
    # then: it imports its client library (Meltano's s3, gcs, azure extras).
    for module, name, fence in (
        ("meltano.core.state_store.s3.backend", "S3StateStoreManager", S3Fence),
        ("meltano.core.state_store.google.backend", "GCSStateStoreManager", GCSFence),
        ("meltano.core.state_store.azure.backend", "AZStorageStateStoreManager", AzureFence),
    ):
        if kind is getattr(sys.modules.get(module), name, None):
            return fence(inner)
    if isinstance(inner, DBStateStoreManager) and kind is DBStateStoreManager:
        return DBFence(inner) if DBFence.supports(inner) else StoreFence(inner)
    return StoreFence(inner, meltanos_own=False)


def encode(state: MeltanoState, token: int | None) -> str:
    """``state.json``'s text: Meltano's own (``MeltanoState.json``), with the token."""
    if token is None:
        return state.json()
    return json.dumps({**state.to_dict(), TOKEN_KEY: token})


def recorded_token(text: str | bytes) -> int | None:
    try:
        value = json.loads(text).get(TOKEN_KEY)
    except (ValueError, AttributeError):  # not JSON, or not an object: Meltano's problem
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decide(recorded: int | None, token: int | None, overtaken: Overtaken) -> int | None:
    """The token to record with a write, given the one recorded: the run's
    own, or the recorded one for a write that is not a run's."""
    if token is None:
        return recorded
    if recorded is not None and recorded > token:
        overtaken(recorded)  # raises, unless the agent says this run still holds the key
    return token


def registered(state_id: str, text: str | bytes | None, token: int, overtaken: Overtaken) -> str | None:
    """The state text ``register`` writes back so that it records ``token``;
    None when there is nothing to write: no state yet (nothing a stale run
    could overwrite), or the token is recorded already."""
    if text is None:
        return None
    recorded = recorded_token(text)
    if recorded == token:
        return None
    decide(recorded, token, overtaken)
    body = text.decode() if isinstance(text, bytes) else text
    return encode(MeltanoState.from_json(state_id, body), token)


class FileFence(StoreFence):
    """Meltano's local store: check and write under a ``flock`` of its directory."""

    def __init__(self, inner: StateStoreManager):
        super().__init__(inner)
        self.local = t.cast(BaseFilesystemStateStoreManager, inner)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # The store's own directory, which Meltano never removes: a lock file
        # inside a state ID's directory would go with `meltano state clear`.
        fd = os.open(self.local.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as err:
                    if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                if time.monotonic() > deadline:
                    raise StateIDLockedError(
                        f"runlock: the state store {self.local.state_dir!r} stayed locked for {LOCK_WAIT_S:g} s"
                    )
                time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _read(self, state_id: str) -> str | None:
        try:
            with open(self.local.get_state_path(state_id), encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def _write(self, state_id: str, text: str) -> None:
        self.local.create_state_id_dir_if_not_exists(state_id)
        with open(self.local.get_state_path(state_id), "w", encoding="utf-8") as handle:
            handle.write(text)

    def register(self, state_id: str, token: int, overtaken: Overtaken) -> None:
        with self._locked():
            text = registered(state_id, self._read(state_id), token, overtaken)
            if text is not None:
                self._write(state_id, text)

    def write(self, state: MeltanoState, token: int | None, overtaken: Overtaken) -> None:
        before_store_write(state.state_id)
        with self._locked():
            text = self._read(state.state_id)
            keep = decide(recorded_token(text) if text is not None else None, token, overtaken)
            self._write(state.state_id, encode(state, keep))

    def delete(self, state_id: str) -> None:
        with self._locked():
            self.inner.delete(state_id)

    def write_all(self, states: Iterable[MeltanoState]) -> int:
        with self._locked():
            return self.inner.set_all(states)


class ObjectFence(StoreFence):
    """A cloud store: the token in ``state.json``, written only if the object
    is still the one read (its ETag or generation), or still absent."""

    def _key(self, state_id: str) -> str:
        return t.cast(BaseFilesystemStateStoreManager, self.inner).get_state_path(state_id)

    def _read(self, key: str) -> tuple[object, bytes | None]:
        """``(version, body)``; ``(None, None)`` when there is no object."""
        raise NotImplementedError

    def _put(self, key: str, body: bytes, version: object) -> bool:
        """Writes ``body`` unless the object is no longer ``version`` (None:
        absent); False when it is not."""
        raise NotImplementedError

    def register(self, state_id: str, token: int, overtaken: Overtaken) -> None:
        key = self._key(state_id)
        for _ in range(ATTEMPTS):
            version, body = self._read(key)
            text = registered(state_id, body, token, overtaken)
            if text is None or self._put(key, text.encode(), version):
                return
        raise StateIDLockedError(f"runlock: the state of {state_id!r} kept changing while this run recorded its token")

    def write(self, state: MeltanoState, token: int | None, overtaken: Overtaken) -> None:
        key = self._key(state.state_id)
        for _ in range(ATTEMPTS):
            version, body = self._read(key)
            keep = decide(recorded_token(body) if body is not None else None, token, overtaken)
            before_store_write(state.state_id)
            if self._put(key, encode(state, keep).encode(), version):
                return
        raise StateIDLockedError(f"runlock: the state of {state.state_id!r} kept changing during this write")


class S3Fence(ObjectFence):
    """Meltano's S3 store: ``PutObject`` with ``If-Match`` / ``If-None-Match: *``."""

    def _read(self, key: str) -> tuple[object, bytes | None]:
        client = self.inner.client  # type: ignore[attr-defined]
        try:
            got = client.get_object(Bucket=self.inner.bucket, Key=key)  # type: ignore[attr-defined]
        except client.exceptions.NoSuchKey:
            return None, None
        return got["ETag"], got["Body"].read()

    def _put(self, key: str, body: bytes, version: object) -> bool:
        client = self.inner.client  # type: ignore[attr-defined]
        condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
        put = {"Bucket": self.inner.bucket, "Key": key, "Body": body, "ContentType": "application/json"}  # type: ignore[attr-defined]
        try:
            client.put_object(**put, **condition)
        except client.exceptions.ClientError as err:
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            # 412: changed since read; 409: a concurrent conditional write won.
            if status in (409, 412):
                return False
            if status != 501:
                raise
            # An S3-compatible store without conditional writes: written as
            # Meltano writes, with the agent check alone before it.
            _log.warning(
                "runlock: the S3 store refused a conditional write (%s); %r is written without the store's fence",
                err, key,
            )
            client.put_object(**put)
        return True


class GCSFence(ObjectFence):
    """Meltano's GCS store: an upload with ``ifGenerationMatch`` (0: absent)."""

    def _blob(self, key: str) -> t.Any:
        return self.inner.client.bucket(self.inner.bucket).blob(key)  # type: ignore[attr-defined]

    def _read(self, key: str) -> tuple[object, bytes | None]:
        from google.api_core.exceptions import NotFound

        blob = self._blob(key)
        try:
            body = blob.download_as_bytes()
        except NotFound:
            return None, None
        # The download sets the generation it read.
        return blob.generation, body

    def _put(self, key: str, body: bytes, version: object) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self._blob(key).upload_from_string(
                body, content_type="application/json", if_generation_match=version if version is not None else 0
            )
        except PreconditionFailed:
            return False
        return True


class AzureFence(ObjectFence):
    """Meltano's Azure store: an upload with ``If-Match`` (``If-None-Match: *``: absent)."""

    def _blob(self, key: str) -> t.Any:
        return self.inner.client.get_blob_client(container=self.inner.container_name, blob=key)  # type: ignore[attr-defined]

    def _read(self, key: str) -> tuple[object, bytes | None]:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            got = self._blob(key).download_blob()
        except ResourceNotFoundError:
            return None, None
        return got.properties.etag, got.readall()

    def _put(self, key: str, body: bytes, version: object) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        try:
            if version is None:
                self._blob(key).upload_blob(body, overwrite=False)
            else:
                self._blob(key).upload_blob(
                    body, overwrite=True, etag=version, match_condition=MatchConditions.IfNotModified
                )
        except (ResourceExistsError, ResourceModifiedError):
            return False
        return True


#: The fence table, in Meltano's system database beside its ``state`` table.
FENCE_TABLE = "runlock_fence"

_CREATE = f"CREATE TABLE IF NOT EXISTS {FENCE_TABLE} (state_id VARCHAR(900) PRIMARY KEY, token BIGINT NOT NULL)"

# Raises the recorded token to the run's, unless a higher one is recorded:
# no row comes back then. The row stays locked until the transaction ends.
_CLAIM = (
    f"INSERT INTO {FENCE_TABLE} (state_id, token) VALUES (:state_id, :token) "
    f"ON CONFLICT (state_id) DO UPDATE SET token = excluded.token WHERE {FENCE_TABLE}.token <= excluded.token "
    "RETURNING token"
)
_SET = f"UPDATE {FENCE_TABLE} SET token = :token WHERE state_id = :state_id"
_GET = f"SELECT token FROM {FENCE_TABLE} WHERE state_id = :state_id"


class DBFence(StoreFence):
    """Meltano's system database: the fence table's row and the state, in one transaction."""

    def __init__(self, inner: StateStoreManager):
        super().__init__(inner)
        self.db = t.cast(DBStateStoreManager, inner)
        self._table: bool | None = None

    @staticmethod
    def supports(inner: DBStateStoreManager) -> bool:
        # INSERT … ON CONFLICT … RETURNING: PostgreSQL, and SQLite from 3.35.
        return inner.session.get_bind().dialect.name in ("postgresql", "sqlite")

    def _exec(self, sql: str, **params: t.Any) -> t.Any:
        from sqlalchemy import text

        return self.db.session.execute(text(sql), params)

    def _ensure_table(self) -> bool:
        """Whether the fence table is there to use: made on first use, unless
        Meltano's database user may not make it (then writes keep the agent
        check alone, with a warning, rather than every run failing)."""
        if self._table is None:
            from sqlalchemy.exc import DBAPIError

            try:
                self._exec(_CREATE)
                self.db.session.commit()
                self._table = True
            except DBAPIError as err:
                self.db.session.rollback()
                _log.warning(
                    "runlock: cannot create the table %s in Meltano's system database (%s); state writes are "
                    "checked through the agent only, without the database's fence",
                    FENCE_TABLE, str(err.orig).strip() or type(err.orig).__name__,
                )
                self._table = False
        return self._table

    def _claim(self, state_id: str, token: int, overtaken: Overtaken) -> None:
        """Raises the recorded token to ``token`` in the open transaction, or
        calls ``overtaken`` (which raises, or has ``token`` recorded anyway)."""
        if self._exec(_CLAIM, state_id=state_id, token=token).first() is not None:
            return
        recorded = self._exec(_GET, state_id=state_id).scalar_one()
        self.db.session.rollback()
        overtaken(int(recorded))
        self._exec(_SET, state_id=state_id, token=token)

    def register(self, state_id: str, token: int, overtaken: Overtaken) -> None:
        if not self._ensure_table():
            return
        try:
            self._claim(state_id, token, overtaken)
            self.db.session.commit()
        except BaseException:
            self.db.session.rollback()
            raise

    def write(self, state: MeltanoState, token: int | None, overtaken: Overtaken) -> None:
        if token is None or not self._ensure_table():
            # A `meltano state` command (the fence is left as it is), or no fence table.
            self.inner.set(state)
            return
        before_store_write(state.state_id)
        try:
            self._claim(state.state_id, token, overtaken)
            self.inner.set(state)  # Meltano's own write; it commits the claim with it
        except BaseException:
            self.db.session.rollback()
            raise
