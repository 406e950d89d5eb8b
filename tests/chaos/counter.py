"""The protected state: one counter per key, in the store the lock lives in,
which each critical section increments once with a fenced read-modify-write,
as a client that uses RUNLOCK_TOKEN writes. The counter keeps, beside its
value, the token and the run of the write that set it; a write whose token
is lower than the one stored is refused, and the store decides in one step
that nothing changed between the read and the write:

- file: ``KEY.json`` in ``counters/`` beside the lock directory, read and
  replaced (a file beside it, then a rename) under an exclusive flock of
  ``KEY.lock``;
- S3: the object ``counters/KEY``, replaced with ``PUT`` ``If-Match`` on the
  ETag read (a write to the object in between fails it: read again);
- PostgreSQL: a row of ``chaos_counter``, locked ``FOR UPDATE`` and updated
  ``WHERE token <= the run's`` in one transaction, through psql.

CHAOS_COUNTER names the store: ``file:DIR``, ``s3:http://HOST:PORT/BUCKET``
or ``pg:URI`` (with CHAOS_PSQL, psql's path). Standard library only, since
critical.py imports it in every run. As a command, for the harness:

  counter.py init KEY...    every counter at 0, written by ``init`` with token 0
  counter.py final KEY...   a V line per counter in CHAOS_LEDGER: its final state
"""

import datetime
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse

# Keys, run ids and tokens go into paths, URLs and SQL as they are: checked first.
SAFE = re.compile(r"[A-Za-z0-9_.-]{1,100}\Z")
# Bounds one increment, store faults (a pause of up to 3 s, a blackhole of 4 s) included.
DEADLINE_S = 20
INIT = (0, 0, "init")


class Unavailable(Exception):
    """The store did not answer, or not as expected: whether the write landed is unknown."""


def _safe(*names):
    for n in names:
        if not SAFE.match(str(n)):
            raise ValueError(f"not a plain name: {n!r}")


class FileCounter:
    def __init__(self, directory):
        self.dir = directory

    def init(self, key):
        os.makedirs(self.dir, exist_ok=True)
        self._replace(key, INIT, "init")

    def read(self, key):
        with open(os.path.join(self.dir, f"{key}.json")) as f:
            d = json.load(f)
        return d["value"], d["token"], d["writer"]

    def _replace(self, key, state, writer):
        path = os.path.join(self.dir, f"{key}.json")
        part = f"{path}.{writer}"
        with open(part, "w") as f:
            json.dump({"value": state[0], "token": state[1], "writer": state[2]}, f)
        os.rename(part, path)

    def cas(self, key, token, writer, fenced, reads):
        fd = os.open(os.path.join(self.dir, f"{key}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o644)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise Unavailable("the counter's flock stayed taken") from None
                    time.sleep(0.002)
            read = self.read(key)
            reads[read[0]] = read
            new = next_state(read, token, writer, fenced)
            if new is not None:
                self._replace(key, new, writer)
            return read, new is not None
        finally:
            os.close(fd)


class S3Counter:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.bucket = u.hostname, u.port, u.path.strip("/")

    def _signed(self, method, path, body, headers):
        """AWS Signature Version 4 with the emulators' test credentials (moto
        answers an unsigned GET with 403)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        day, stamp = now.strftime("%Y%m%d"), now.strftime("%Y%m%dT%H%M%SZ")
        scope = f"{day}/us-east-1/s3/aws4_request"
        headers = {**headers, "host": f"{self.host}:{self.port}", "x-amz-date": stamp,
                   "x-amz-content-sha256": hashlib.sha256(body or b"").hexdigest()}
        names = sorted(h.lower() for h in headers)
        lower = {h.lower(): str(v).strip() for h, v in headers.items()}
        canonical = "\n".join([method, path, ""] + [f"{n}:{lower[n]}" for n in names]
                              + ["", ";".join(names), lower["x-amz-content-sha256"]])
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        k = b"AWS4test"
        for part in (day, "us-east-1", "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential=test/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return headers

    def _request(self, method, key, body=None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=DEADLINE_S)
        path = f"/{self.bucket}/counters/{key}"
        try:
            conn.request(method, path, body, self._signed(method, path, body, headers or {}))
            r = conn.getresponse()
            return r.status, r.getheader("ETag"), r.read()
        except (OSError, http.client.HTTPException) as e:
            raise Unavailable(f"{method}: {e}") from None
        finally:
            conn.close()

    def _put(self, key, state, headers):
        body = json.dumps({"value": state[0], "token": state[1], "writer": state[2]}).encode()
        status, _, _ = self._request("PUT", key, body,
                                     {"Content-Type": "application/json", **headers})
        if status in (409, 412):  # changed since read; or a concurrent conditional write won
            return False
        if status != 200:
            raise Unavailable(f"PUT: HTTP {status}")
        return True

    def init(self, key):
        if not self._put(key, INIT, {}):
            raise Unavailable("PUT refused")

    def _get(self, key):
        status, etag, body = self._request("GET", key)
        if status != 200 or not etag:
            raise Unavailable(f"GET: HTTP {status}")
        d = json.loads(body)
        return (d["value"], d["token"], d["writer"]), etag

    def read(self, key):
        return self._get(key)[0]

    def cas(self, key, token, writer, fenced, reads):
        read, etag = self._get(key)
        reads[read[0]] = read  # before the write, whose answer may be lost
        new = next_state(read, token, writer, fenced)
        # Not written when someone wrote in between, too: increment() reads again.
        return read, new is not None and self._put(key, new, {"If-Match": etag})


class PgCounter:
    TABLE = "chaos_counter"

    def __init__(self, uri, psql):
        self.uri, self.psql = uri, psql

    def _sql(self, script):
        try:
            p = subprocess.run([self.psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                                "-d", self.uri, "-f", "-"], input=script.encode(),
                               capture_output=True, timeout=DEADLINE_S,
                               env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
        except subprocess.TimeoutExpired:
            raise Unavailable("psql timed out") from None
        if p.returncode != 0:
            raise Unavailable(f"psql exited {p.returncode}")
        return [line.split("|") for line in p.stdout.decode().splitlines() if line]

    def init(self, key):
        self._sql(f"CREATE TABLE IF NOT EXISTS {self.TABLE} (key text PRIMARY KEY, value bigint "
                  "NOT NULL, token bigint NOT NULL, writer text NOT NULL);\n"
                  f"INSERT INTO {self.TABLE} VALUES ('{key}', 0, 0, 'init');\n")

    def read(self, key):
        [[v, t, w]] = self._sql(f"SELECT value, token, writer FROM {self.TABLE} WHERE key = '{key}';")
        return int(v), int(t), w

    def cas(self, key, token, writer, fenced, reads):
        # One transaction: the row locked as read, then the write, fenced in the
        # statement itself (next_state's rules, in SQL).
        fence = f"AND token <= {token} " if fenced else ""
        rows = self._sql(
            "BEGIN;\n"
            f"SELECT value, token, writer FROM {self.TABLE} WHERE key = '{key}' FOR UPDATE;\n"
            f"UPDATE {self.TABLE} SET value = value + 1, token = {token}, writer = '{writer}' "
            f"WHERE key = '{key}' {fence}AND writer <> '{writer}' RETURNING value;\n"
            "COMMIT;\n")
        v, t, w = rows[0]
        read = reads[int(v)] = (int(v), int(t), w)
        return read, len(rows) > 1


# Each store's cas(key, token, writer, fenced, reads) reads the counter, adds
# what it read to `reads` (value -> state: what a write replaced, known even
# when the write's answer is lost), writes next_state's result in the store's
# one conditional step, and returns (state read, whether it wrote).


def next_state(read, token, writer, fenced):
    """What a write makes of the state read, or None: nothing to write, since an
    earlier try of this run landed (its answer lost), or (fenced) the state
    records a higher token than the run's."""
    if read[2] == writer or (fenced and read[1] > token):
        return None
    return (read[0] + 1, token, writer)


def open_store(spec=None):
    spec = spec or os.environ["CHAOS_COUNTER"]
    kind, _, where = spec.partition(":")
    if kind == "file":
        return FileCounter(where)
    if kind == "s3":
        return S3Counter(where)
    if kind == "pg":
        return PgCounter(where, os.environ.get("CHAOS_PSQL", "psql"))
    raise ValueError(f"CHAOS_COUNTER: unknown store {kind!r}")


def increment(store, key, token, writer, fenced=True):
    """The run's one increment: ("written", value written, (value, token, writer)
    replaced, conflicts) or ("refused", value found, (value, token, writer) found,
    conflicts). ``fenced=False`` leaves out the token check: a client that does
    not fence, which the checker must catch. Raises Unavailable when the store
    did not answer within DEADLINE_S (the write may have landed)."""
    _safe(key, writer, token)
    token = int(token)
    reads = {}
    conflicts = 0
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            read, written = store.cas(key, token, writer, fenced, reads)
        except Unavailable:
            # The write may have landed (a connection dropped after the request
            # went out): the next read says, since the counter names its writer.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        if read[2] == writer:
            return "written", read[0], reads.get(read[0] - 1), conflicts
        if written:
            return "written", read[0] + 1, read, conflicts
        if fenced and read[1] > token:
            return "refused", read[0], read, conflicts
        # The object changed between the read and the write: read again.
        conflicts += 1
        if time.monotonic() > deadline:
            raise Unavailable(f"still conflicting after {conflicts} tries")


def main(argv):
    what, keys = argv[1], argv[2:]
    _safe(*keys)
    store = open_store()
    if what == "init":
        for k in keys:
            store.init(k)
    elif what == "final":
        fd = os.open(os.environ["CHAOS_LEDGER"], os.O_WRONLY | os.O_APPEND)
        for k in keys:
            v, t, w = store.read(k)
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            os.write(fd, f"V\t{now}\t{k}\t{v}\t{t}\t{w}\n".encode())
    else:
        raise SystemExit(f"usage: counter.py init|final KEY...; not {what!r}")


if __name__ == "__main__":
    main(sys.argv)
