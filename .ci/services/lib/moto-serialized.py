"""moto's server, answering one request at a time.

moto's own server (`moto_server`) handles requests on many threads, and its
DynamoDB backend checks a ConditionExpression and applies the write without
a lock: two conditional writes of one item can both pass their check. Real
DynamoDB applies each conditional write atomically, so the DynamoDB store's
tests run moto behind one lock (connections still on many threads, HTTP
keep-alive kept). Usage: python moto-serialized.py HOST PORT
"""

import sys
import threading

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            # The whole body, under the lock.
            return list(app(environ, start_response))

    run_simple(host, port, serialized, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
