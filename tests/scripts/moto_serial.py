"""moto's S3 server with the writes to one object applied one at a time.

moto_server answers on a thread per connection, and its PutObject checks
If-None-Match / If-Match and then writes with no lock between: two agents
racing for one key could both be told 200 (the chaos harness saw it once in
9,217 runs, docs/src/reliability.md). A real store applies a conditional write
atomically, so the tests' moto must too. Writes (anything but GET and HEAD)
to one path take that path's lock, so a condition and its write are one step;
reads and writes to other objects go on beside them, as on a real store (an
earlier version serialised every request, and 100 runs reattaching at once
then queued behind each other for seconds). Each request's body is read
first, outside any lock, so that a client stalled mid-request (a blackhole
from the chaos proxy) holds up only itself.

Usage: python moto_serial.py -H HOST -p PORT
"""

import argparse
import io
import logging
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


class S3Only(DomainDispatcherApplication):
    """moto's dispatcher, which knows at once that a request is S3's."""

    def __init__(self):
        super().__init__(create_backend_app)
        self.s3 = create_backend_app("s3")

    def get_application(self, environ):
        if environ.get("PATH_INFO", "").startswith("/moto-api"):
            return super().get_application(environ)
        return self.s3


class OneWritePerObject:
    def __init__(self, app):
        self.app = app
        self.guard = threading.Lock()  # over `locks` alone
        self.locks = {}  # path -> [lock, requests holding or awaiting it]

    def __call__(self, environ, start_response):
        environ["wsgi.input"] = io.BytesIO(read_body(environ))
        if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            return self.answer(environ, start_response)
        # The path alone names the object: every client here addresses moto
        # path-style (the agent does for any endpoint it is given), and the
        # Host differs by route (each chaos agent comes through a proxy of its
        # own), so keying on it let two agents' PUTs of one object race again.
        path = environ.get("PATH_INFO", "")
        with self.guard:
            entry = self.locks.setdefault(path, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                return self.answer(environ, start_response)
        finally:
            with self.guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self.locks[path]

    def answer(self, environ, start_response):
        """moto's whole answer, produced before any lock is let go."""
        answer = self.app(environ, start_response)
        try:
            return [b"".join(answer)]
        finally:
            getattr(answer, "close", lambda: None)()


def read_body(environ):
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        return stream.read(int(length))
    if environ.get("wsgi.input_terminated"):
        return stream.read()
    return b""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args()
    # One line per request, under a lock: errors are still logged.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    run_simple(
        args.host,
        args.port,
        OneWritePerObject(S3Only()),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
