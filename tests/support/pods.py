"""Pods: stores of one tenant, each with its own connection and memory, opened and closed together.

``tests/conftest.py``'s ``pods`` fixture builds them one at a time; these open a fixed set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from ctxstore import ContextStore, Settings


@asynccontextmanager
async def pods_on(*configs: Settings, tenant: str) -> AsyncIterator[list[ContextStore]]:
    """One pod of ``tenant`` on each of ``configs``, in order."""
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(ContextStore.from_settings(c, tenant=tenant))
            for c in configs
        ]


@asynccontextmanager
async def fast_retry_pods(settings: Settings, tenant: str, **overrides: Any) -> AsyncIterator[Any]:
    """Two pods of one tenant (fast retries): the one attacked, and another."""
    own = settings.model_copy(
        update={"retry_base_delay": 0.001, "retry_max_delay": 0.002, **overrides}
    )
    async with (
        ContextStore.from_settings(own, tenant=tenant) as pod,
        ContextStore.from_settings(own, tenant=tenant) as other,
    ):
        yield pod, other


@asynccontextmanager
async def warm_and_cold_pods(settings: Settings, tenant: str) -> AsyncIterator[list[ContextStore]]:
    """Two warm pods and a cold one, on one tenant."""
    cold = settings.model_copy(update={"view_cache_bytes": 0})
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as a,
        ContextStore.from_settings(settings, tenant=tenant) as b,
        ContextStore.from_settings(cold, tenant=tenant) as c,
    ):
        yield [a, b, c]
