"""The shipped test helpers: the audit must catch what it claims to catch."""

from __future__ import annotations

import multiprocessing
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from support.config import RUN_PREFIX
from support.servers import ServerPool

from ctxstore import ContextStore, testing
from ctxstore.testing import (
    Ack,
    LocalCluster,
    ManualClock,
    PortTakenError,
    WordCounter,
    audit,
    free_port,
    orphans,
    pings,
    redis_under_test,
    remove_keys,
    stop_processes,
)


def key(message: dict[str, Any]) -> tuple[str, int] | None:
    """(writer, index) from a message like {"content": "w:3"}."""
    writer, _, index = message["content"].partition(":")
    return (writer, int(index)) if index else None


async def test_audit_passes_a_sound_session(store: ContextStore) -> None:
    """Acks that match the history give an all-zero audit."""
    acks = []
    for i in range(3):
        result = await store.append("s", {"role": "user", "content": f"w:{i}"})
        acks.append(Ack("w", i, result.entry_id, result.epoch))
    found = await audit(store, "s", acks, key_of=key)
    assert (found.lost, found.duplicated, found.out_of_order, found.checked) == (0, 0, 0, 3)


async def test_audit_catches_loss_doubles_and_reordering(store: ContextStore) -> None:
    """A missing ack, a doubled message and a writer's swapped order are each counted."""
    first = await store.append("s", {"role": "user", "content": "w:0"})
    second = await store.append("s", {"role": "user", "content": "w:1"})
    await store.append("s", {"role": "user", "content": "w:1"})  # stored twice
    acks = [
        Ack("w", 0, second.entry_id, 0),  # claims index 0 got the later id...
        Ack("w", 1, first.entry_id, 0),  # ...and index 1 the earlier: out of order, and wrong ids
        Ack("w", 2, "9999999999999-0", 0),  # acked but never stored
    ]
    found = await audit(store, "s", acks, key_of=key)
    assert found.duplicated == 1
    assert found.out_of_order == 1
    assert found.lost == 3


async def test_audit_counts_appends_a_rewrite_did_not_account_for(store: ContextStore) -> None:
    """An ack in a superseded epoch that the rewrite's count misses is lost."""
    acked = await store.append("s", {"role": "user", "content": "w:0"})
    rewrite = await store.clear("s")
    acks = [Ack("w", 0, acked.entry_id, 0), Ack("w", 1, "1-1", 0)]  # the second never happened
    found = await audit(store, "s", acks, [rewrite], key_of=key)
    assert found.lost == 1


def test_manual_clock_and_word_counter() -> None:
    """The manual clock moves only when told; the word counter counts words."""
    clock = ManualClock(1000)
    clock.advance(1.5)
    assert clock.now_ms() == 2500
    assert WordCounter().count("three little words") == 3


needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="redis-server and redis-cli are needed for a local cluster",
)


def test_free_ports_never_hand_out_a_port_that_is_another_ports_bus() -> None:
    """Each port and its cluster bus port (+10000) are distinct from every other."""
    ports = testing.free_ports(40)
    every = ports + [port + 10000 for port in ports]
    assert len(set(every)) == len(every)
    assert max(every) < 65536


def test_orphans_counts_unanswered_calls_and_results_without_a_call() -> None:
    """A call with its result is sound; a lone call and a lone result count one each."""
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    stray = {"role": "tool", "tool_call_id": "c2", "content": "ok"}
    assert orphans([call, result]) == 0
    assert orphans([call]) == 1
    assert orphans([call, result, stray]) == 1
    assert orphans([]) == 0


def test_pings_tells_a_redis_from_a_silent_port_and_a_closed_one(servers: ServerPool) -> None:
    """True for a Redis answering PONG; False for a port that never answers or nobody holds."""
    server = servers.start()
    assert pings(server.port)
    server.pause()
    try:
        assert not pings(server.port)  # connected, never answered
    finally:
        server.resume()
    with listening() as silent:
        assert not pings(silent)
    assert not pings(free_port())


def test_redis_under_test_prefers_the_configured_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """CTXSTORE_REDIS_URL wins, whatever answers on 6379."""
    monkeypatch.setenv("CTXSTORE_REDIS_URL", "redis://example.invalid:6380/2")
    with redis_under_test() as (url, label):
        assert (url, label) == ("redis://example.invalid:6380/2", "CTXSTORE_REDIS_URL")


async def test_remove_keys_removes_the_prefix_and_its_arq_keys_and_nothing_else(
    redis_url: str,
) -> None:
    """Keys under the prefix and arq's keys naming it go (counted); a neighbour's stay."""
    prefix = f"{RUN_PREFIX}-rk{uuid.uuid4().hex[:6]}"
    neighbour = f"{RUN_PREFIX}-keep{uuid.uuid4().hex[:6]}"  # the run's teardown removes it
    client = Redis.from_url(redis_url)
    try:
        mine = [f"{prefix}:{{t:s}}:log{i}" for i in range(1_203)]  # more than two batches
        mine += [f"{prefix}:summaries", f"arq:job:{prefix}:sum:t:s:1", f"arq:result:{prefix}:x"]
        await client.mset(dict.fromkeys([*mine, neighbour], b"1"))
        assert await remove_keys(client, prefix) == len(mine)
        assert await client.exists(*mine) == 0
        assert await client.exists(neighbour) == 1
        assert await remove_keys(redis_url, prefix) == 0  # by URL too; nothing left
    finally:
        await client.delete(neighbour)
        await client.aclose()


def test_stop_processes_stops_running_children_and_skips_unstarted_ones() -> None:
    """A running child is stopped and reaped; one never started is left alone; twice is fine."""
    spawn = multiprocessing.get_context("spawn")
    running = spawn.Process(target=time.sleep, args=(600,))
    unstarted = spawn.Process(target=time.sleep, args=(600,))
    running.start()
    try:
        stop_processes([running, unstarted], timeout=10)
        assert running.exitcode is not None and running.exitcode < 0  # killed by a signal
        assert unstarted.pid is None
        stop_processes([running, unstarted])
    finally:
        if running.is_alive():
            running.kill()
            running.join()


@contextmanager
def listening() -> Iterator[int]:
    """A loopback port held by a listening socket for the duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def track_nodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[subprocess.Popen[bytes], str]]:
    """Record every node LocalCluster starts, with its directory."""
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    start_node = LocalCluster.start_node

    def tracked(self: LocalCluster, port: int) -> None:
        try:
            start_node(self, port)
        finally:
            started.append((self.processes[port], self.directory))

    monkeypatch.setattr(LocalCluster, "start_node", tracked)
    return started


@needs_redis_server
def test_a_cluster_whose_port_was_taken_starts_again_on_new_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that cannot bind its port makes start() retry on fresh ports."""
    started = track_nodes(monkeypatch)
    chosen: list[list[int]] = []
    free_ports = testing.free_ports
    with listening() as taken:

        def rigged(count: int) -> list[int]:
            chosen.append([taken] if not chosen else free_ports(count))
            return chosen[-1]

        monkeypatch.setattr(testing, "free_ports", rigged)
        cluster = LocalCluster.start(primaries=1, replicas=0)
    try:
        assert len(chosen) == 2 and cluster.ports == chosen[1]
        assert started[0][0].poll() is not None  # the node on the taken port exited
        assert not Path(started[0][1]).exists()
        info = subprocess.run(
            ["redis-cli", "-p", str(cluster.ports[0]), "cluster", "info"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "cluster_state:ok" in info.stdout
    finally:
        cluster.stop()


@needs_redis_server
def test_a_cluster_that_cannot_start_leaves_no_node_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every attempt's good nodes are stopped and its directory removed; the error says why."""
    started = track_nodes(monkeypatch)
    free_ports = testing.free_ports
    with listening() as taken:
        monkeypatch.setattr(testing, "free_ports", lambda count: [*free_ports(count - 1), taken])
        with pytest.raises(PortTakenError, match="Address already in use"):
            LocalCluster.start(primaries=2, replicas=0)
    assert len(started) == 6  # three attempts, a good node and the one on the taken port
    assert all(process.poll() is not None for process, _ in started)
    assert not any(Path(directory).exists() for _, directory in started)
