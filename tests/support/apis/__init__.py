"""Model APIs played back over httpx's MockTransport: each answer as the service sends it.

:class:`ScriptedAPI` plays one scripted reply per request and records each request, for
the tests to check what the SDK sent; ``messages`` holds Anthropic's answers, ``chat``
those of OpenAI's Chat Completions API (and the servers that speak it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx2

Reply = httpx2.Response | Callable[[httpx2.Request], httpx2.Response]
"""A scripted answer, or a function of the request that returns or raises one."""


def raising(make: Callable[[httpx2.Request], Exception]) -> Callable[[httpx2.Request], Any]:
    """A reply that fails at the transport (a timeout, a refused connection)."""

    def reply(request: httpx2.Request) -> httpx2.Response:
        raise make(request)

    return reply


class ScriptedAPI:
    """Plays back one scripted reply per request and records every request.

    Args:
        unscripted: The answer to a request the test scripted no reply for.
    """

    def __init__(self, unscripted: Callable[[], httpx2.Response]) -> None:
        self.requests: list[httpx2.Request] = []
        self.script: list[Reply] = []
        self._unscripted = unscripted
        self.http = httpx2.AsyncClient(transport=httpx2.MockTransport(self._handle))

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if not self.script:
            return self._unscripted()
        reply = self.script.pop(0)
        return reply(request) if callable(reply) else reply
