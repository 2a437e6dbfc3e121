"""What the framework adapters share: writes that settle even when their caller is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["settled"]

_T = TypeVar("_T")


async def settled(write: Awaitable[_T]) -> _T:
    """Wait for a write's outcome even when the caller is cancelled meanwhile.

    A write cancelled in flight may still reach Redis after its caller has
    moved on: a retried append could then land twice, or a clear land
    after the next turn's items. So the write runs to its end, and the
    cancellation is raised once it has, as the SDK's own sessions do.
    """
    task = asyncio.ensure_future(write)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller gets
        raise cancelled
    return task.result()
