"""moto's S3 server with one request applied at a time.

moto_server answers on a thread per connection, and its PutObject checks
If-None-Match / If-Match and then writes with no lock between: two agents
racing for one key could both be told 200 (the chaos harness saw it once in
9,217 runs, RELIABILITY.md). A real store applies a conditional write
atomically, so the tests' moto must too. Each request's body is read first,
outside the lock, so that a client stalled mid-request (a blackhole from the
chaos proxy) holds up only itself; only moto's own work is serialised.

Usage: python moto_serial.py -H HOST -p PORT
"""

import argparse
import io
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


class OneAtATime:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        environ["wsgi.input"] = io.BytesIO(read_body(environ))
        with self.lock:
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
    run_simple(
        args.host,
        args.port,
        OneAtATime(DomainDispatcherApplication(create_backend_app)),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
