"""Serve the summary queue's depth as JSON, for KEDA's ``metrics-api`` trigger.

KEDA's ``redis`` trigger scales on the length of a list (``LLEN``), but arq's
queue is a sorted set, so it cannot read it. This exporter can:
``GET /depth`` answers ``{"depth": N}``, where N is ``SummaryQueue.depth()``
(``ZCARD`` of the queue): the jobs waiting, deferred for a retry, or running
(arq removes a job from the set when it ends). ``GET /healthz`` answers 200
while the process is up.

Settings come from ``CTXSTORE_*`` variables, as for the worker: the queue's
Redis is ``CTXSTORE_QUEUE_URL`` (else ``CTXSTORE_REDIS_URL``), its name
``CTXSTORE_QUEUE_NAME``. The ``ctxstore-pod`` ACL user may read it.

Run: ``python queue_depth_exporter.py [--port 8080]`` (the image has it at
``/opt/ctxstore/queue_depth_exporter.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ctxstore import Settings
from ctxstore.jobs import SummaryQueue

log = logging.getLogger("ctxstore.queue_depth")

VALUE_LOCATION = "depth"
"""The JSON field holding the depth: the ScaledObject's ``valueLocation``."""


def body(depth: int) -> bytes:
    """The JSON answer of ``GET /depth``."""
    return json.dumps({VALUE_LOCATION: depth}).encode()


async def read_depth(settings: Settings) -> int:
    """The queue's depth, on a connection opened for this one read."""
    queue = await SummaryQueue.connect(settings)
    try:
        return await queue.depth()
    finally:
        await queue.aclose()


class Handler(BaseHTTPRequestHandler):
    """Answers ``/depth`` and ``/healthz``, each request in a thread of its own."""

    settings: Settings

    def do_GET(self) -> None:
        """Serve one request."""
        if self.path == "/healthz":
            self._answer(200, b'{"ok": true}')
            return
        if self.path != "/depth":
            self._answer(404, b'{"error": "not found"}')
            return
        deadline = self.settings.connect_timeout + self.settings.operation_timeout
        try:
            depth = asyncio.run(asyncio.wait_for(read_depth(self.settings), deadline))
        except Exception as exc:  # noqa: BLE001 - any failure is a 503 that KEDA counts
            log.warning("queue depth unavailable: %r", exc)
            self._answer(503, json.dumps({"error": repr(exc)}).encode())
            return
        self._answer(200, body(depth))

    def _answer(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet access log: KEDA polls every few seconds."""


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    settings = Settings()
    log.info("serving the depth of %s on :%d", settings.queue_name, args.port)
    make_server(settings, "", args.port).serve_forever()


def make_server(settings: Settings, host: str, port: int) -> ThreadingHTTPServer:
    """The exporter's server, bound and not yet serving.

    A thread per request: a slow ``/depth`` (Redis slow or unreachable, up to
    the connect and operation timeouts) never holds ``/healthz`` up, so the
    liveness probe keeps an ordinary timeout.
    """
    Handler.settings = settings
    return ThreadingHTTPServer((host, port), Handler)


if __name__ == "__main__":
    main()
