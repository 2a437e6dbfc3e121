"""Functions admin: this version's library loaded on every primary, others' pruned.

An operator's calls (``ctxstore functions load`` and ``prune``), never a
request's: each version of ctxstore names its Functions library after its
scripts' hash (:data:`ctxstore._redis.scripts.LIBRARY_NAME`), so versions run
side by side in a rolling upgrade, and the old ones' are deleted once none is
left. Each command goes through a store's
:class:`~ctxstore._redis.connection.Connection`, retried and translated as any.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from redis import exceptions as rex
from redis.asyncio import RedisCluster

from ctxstore._layout.codec import raw_pairs, text
from ctxstore._redis.scripts import LIBRARY_NAME, library
from ctxstore.errors import ConfigurationError

if TYPE_CHECKING:
    from ctxstore._redis.connection import Connection

__all__ = ["library_names", "load_functions", "prune_functions"]

T = TypeVar("T")

_OUR_LIBRARY = re.compile(r"ctxstore_[0-9a-f]{12}")
"""A Functions library's name as a version of ctxstore makes it (``scripts.LIBRARY_NAME``)."""


def library_names(listed: Sequence[Any]) -> list[str]:
    """The library names in a ``FUNCTION LIST`` reply (each library a flat list or a map)."""
    return [
        text(value)
        for entry in listed
        for field, value in raw_pairs(entry)
        if text(field) == "library_name"
    ]


async def load_functions(connection: Connection) -> list[str]:
    """Load the scripts as a Functions library on every primary (an operator's call).

    Args:
        connection: The store's connection to its Redis.

    Returns:
        The addresses of the nodes it was loaded on.

    Raises:
        PermissionDeniedError: This Redis user may not run ``FUNCTION LOAD``.
    """
    load = ("FUNCTION", "LOAD", "REPLACE", library())

    async def on_node(run: Callable[..., Awaitable[Any]], _: str) -> None:
        await connection.call(lambda: run(*load))

    return list(await _on_primaries(connection, on_node))


async def prune_functions(connection: Connection) -> dict[str, list[str]]:
    """Delete every other version's library from every primary (an operator's call).

    Each version of ctxstore loads a library of its own (``ctxstore_`` and 12
    hex digits of its scripts' hash), so pods of two versions run side by side
    in a rolling upgrade; the others' stay loaded (265 KB of Redis's memory
    for this version's, replicated and persisted with the data) until this
    deletes them. Newer versions' too: run it from the newest version, once
    no pod of another is left (such a pod's next script call fails until its
    library is loaded again). Libraries named otherwise are not touched.

    Args:
        connection: The store's connection to its Redis.

    Returns:
        Per node's address, the libraries deleted there.

    Raises:
        ConfigurationError: This version's library is not loaded on a node
            (nothing was deleted there): ``load_functions`` first.
        PermissionDeniedError: This Redis user may not run ``FUNCTION``.
    """

    async def on_node(run: Callable[..., Awaitable[Any]], where: str) -> list[str]:
        listed = await connection.call(lambda: run("FUNCTION", "LIST", "LIBRARYNAME", "ctxstore_*"))
        names = library_names(listed)
        if LIBRARY_NAME not in names:
            raise ConfigurationError(
                f"{LIBRARY_NAME}, this version's library, is not loaded on {where}: "
                "nothing was pruned there (`ctxstore functions load` first)"
            )
        deleted = []
        for name in names:
            ours = name != LIBRARY_NAME and _OUR_LIBRARY.fullmatch(name)
            if ours and await _delete_library(connection, run, name):
                deleted.append(name)
        return deleted

    return await _on_primaries(connection, on_node)


async def _delete_library(
    connection: Connection, run: Callable[..., Awaitable[Any]], name: str
) -> bool:
    """``FUNCTION DELETE name`` (retried as any command is); False if another deleted it.

    A library gone at the first attempt was deleted by another prune; gone at a
    retry, it is counted as this one's (its earlier attempt's reply was lost, or
    it never arrived and another prune deleted it meanwhile: both then report it).
    """
    attempts = 0

    async def delete() -> bool:
        nonlocal attempts
        attempts += 1
        try:
            await run("FUNCTION", "DELETE", name)
        except rex.ResponseError as exc:
            if "library not found" not in str(exc).lower():
                raise
            return attempts > 1
        return True

    return bool(await connection.call(delete))


async def _on_primaries(
    connection: Connection, on_node: Callable[[Callable[..., Awaitable[Any]], str], Awaitable[T]]
) -> dict[str, T]:
    """Run ``on_node`` on the store's Redis, or on every primary of its cluster.

    ``on_node`` gets a function that sends a command to its node, once (it
    retries, by ``call``, what it sends), and the node's address. Returns its
    result per address (``"the store's Redis"`` on a single server).
    """
    if not connection.cluster:
        where = "the store's Redis"
        return {where: await on_node(connection.client.execute_command, where)}
    client = cast(RedisCluster, connection.client)
    if client._initialize:
        await connection.call(client.initialize)
    results = {}
    for node in client.get_primaries():

        async def send(*command: Any, node: Any = node) -> Any:
            return await client.execute_command(*command, target_nodes=node)

        where = f"{node.host}:{node.port}"
        results[where] = await on_node(send, where)
    return results
