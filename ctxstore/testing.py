"""Deterministic test doubles and checks, for ctxstore's tests and for yours.

- :class:`ManualClock`: the time leases use, moved by hand, so a test can
  expire a lease without sleeping.
- :class:`WordCounter`: a token counter that counts words; fast, predictable.
- :class:`FakeSummarizer`: a deterministic summarizer that records its
  calls, and can be made to wait (for a test to act mid-job) or to fail.
- :func:`audit`: checks a session's history against what its writers were
  told (nothing lost, nothing doubled, each writer's order kept).
- :func:`orphans`: tool calls without their result, and results without
  their call, in a view (0 in a sound one).
- :class:`LocalCluster`: a real Redis Cluster on loopback ports (primaries,
  replicas, failover), for tests that must run on one.
- :func:`redis_under_test`: the Redis to test or measure against;
  :func:`remove_keys` deletes a run's keys from it afterwards.
- :func:`free_port`, :func:`free_ports`, :func:`pings` and
  :func:`stop_processes`: loopback ports, a liveness check, and child
  processes stopped whatever happened.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from ctxstore._layout.formats import call_ids, entry_order, result_ids
from ctxstore.embedded import EmbeddedRedis, ServerStartError, start_server

if TYPE_CHECKING:
    from ctxstore.models import WriteResult
    from ctxstore.store import ContextStore

__all__ = [
    "Ack",
    "Audit",
    "FakeSummarizer",
    "LocalCluster",
    "ManualClock",
    "PortTakenError",
    "WordCounter",
    "audit",
    "free_port",
    "free_ports",
    "orphans",
    "pings",
    "redis_under_test",
    "remove_keys",
    "stop_processes",
]


class ManualClock:
    """A clock that moves only when told to.

    Args:
        start_ms: The time it starts at, in milliseconds since the epoch.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        """The current (manual) time in milliseconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self._now += int(seconds * 1000)


class WordCounter:
    """Counts whitespace-separated words as tokens."""

    def count(self, text: str) -> int:
        """The number of words in ``text``."""
        return len(text.split())


class FakeSummarizer:
    """A summarizer for tests: deterministic output, recorded calls, scripted trouble.

    Its summary lists, for every message it saw, the role and the first
    words, after the previous summary's lines: a test can check exactly
    which messages a summary covers.

    Args:
        fail: Errors to raise, one per call, before it starts succeeding
            (e.g. ``[SummarizerUnavailableError("429")]``).
        gate: If given, each call waits for this event (a test acts mid-job).
        name: The model name it reports.

    Attributes:
        calls: ``(previous, messages)`` of every call, in order.
        started: Set when a call begins (before it waits on ``gate``).
    """

    def __init__(
        self,
        *,
        fail: Iterable[BaseException] = (),
        gate: asyncio.Event | None = None,
        name: str = "fake",
    ) -> None:
        self.name = name
        self.calls: list[tuple[str | None, list[dict[str, Any]]]] = []
        self.started = asyncio.Event()
        self._fail = list(fail)
        self._gate = gate

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """Return a line per message after the previous summary's lines."""
        self.calls.append((previous, list(messages)))
        self.started.set()
        if self._gate is not None:
            await self._gate.wait()
        if self._fail:
            raise self._fail.pop(0)
        lines = [previous] if previous else []
        for message in messages:
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            lines.append(f"{message.get('role')}: {' '.join(str(text).split()[:6])}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Ack:
    """An append the store acknowledged, as a writer recorded it.

    Attributes:
        writer: Who appended it.
        index: Its position in that writer's own sequence.
        entry_id: The entry id the store answered.
        epoch: The epoch the store answered.
    """

    writer: Hashable
    index: int
    entry_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Audit:
    """What :func:`audit` found; all zero when the session is sound.

    Attributes:
        lost: Acknowledged appends neither in the history nor superseded by a rewrite.
        duplicated: Messages stored more than once.
        out_of_order: Consecutive appends of one writer stored in the other order.
        checked: Acknowledged appends checked.
    """

    lost: int
    duplicated: int
    out_of_order: int
    checked: int


async def audit(
    store: ContextStore,
    session: str,
    acks: Iterable[Ack],
    rewrites: Iterable[WriteResult] = (),
    key_of: Callable[[dict[str, Any]], tuple[Hashable, int] | None] = lambda m: None,
) -> Audit:
    """Check a session's history against what writers were told.

    An append acknowledged in the current epoch must be in the history, once,
    under the entry id it was given; one acknowledged in an earlier epoch
    must be counted in the ``superseded`` of the rewrite that ended that
    epoch (so: every message that epoch's rewrite wrote, plus every append
    acknowledged in it). Each writer's appends must be stored in its order.

    Args:
        store: The store.
        session: The session.
        acks: Every acknowledged append.
        rewrites: Every replace and clear of the session, in any order.
        key_of: ``(writer, index)`` of a stored message, or ``None`` for
            messages no writer appended (a rewrite's).
    """
    acks = list(acks)
    stored = [s async for s in store.iter_history(session)]
    epoch = (await store.info(session)).epoch
    seen: dict[tuple[Hashable, int], list[str]] = {}
    for message in stored:
        key = key_of(message.message)
        if key is not None:
            seen.setdefault(key, []).append(message.entry_id)
    duplicated = sum(len(ids) - 1 for ids in seen.values())
    lost = sum(
        1
        for a in acks
        if a.epoch == epoch and seen.get((a.writer, a.index), [None])[0] != a.entry_id
    )
    written = {0: 0} | {r.epoch: r.count for r in rewrites}
    superseded = {r.epoch: r.superseded for r in rewrites}
    per_epoch = Counter(a.epoch for a in acks)
    for old in range(epoch):
        expected = written.get(old, 0) + per_epoch[old]
        lost += max(0, expected - superseded.get(old + 1, expected))
    out_of_order = 0
    by_writer: dict[tuple[Hashable, int], list[Ack]] = {}
    for a in acks:
        by_writer.setdefault((a.writer, a.epoch), []).append(a)
    for mine in by_writer.values():
        mine.sort(key=lambda a: a.index)
        out_of_order += sum(
            1
            for x, y in itertools.pairwise(mine)
            if entry_order(x.entry_id) >= entry_order(y.entry_id)
        )
    return Audit(lost, duplicated, out_of_order, len(acks))


def orphans(messages: Iterable[dict[str, Any]]) -> int:
    """Tool calls without their result plus results without their call, in ``messages``.

    A view must never hold one: 0 for every view the store sends.
    """
    messages = list(messages)
    calls = Counter(c for m in messages for c in call_ids(m))
    results = Counter(r for m in messages for r in result_ids(m))
    return sum((calls - results).values()) + sum((results - calls).values())


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (another process may take it)."""
    return _bind_free(0)


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports free now, with their cluster bus ports (+10000).

    No port is another's bus port: a node whose bus port is a second node's
    port cannot start.
    """
    ports: list[int] = []
    taken: set[int] = set()
    while len(ports) < count:
        port = free_port()
        bus = port + 10000
        if bus < 65536 and not {port, bus} & taken and _bind_free(bus) == bus:
            ports.append(port)
            taken |= {port, bus}
    return ports


def _bind_free(port: int) -> int:
    """Bind ``port`` on loopback (0: any) and let it go: the port, or 0 if taken."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return 0
        return int(sock.getsockname()[1])


def pings(port: int) -> bool:
    """True if a server on loopback ``port`` answers PING with ``+PONG`` (within 0.5 s).

    False when nothing listens, the server is paused or still loading, or
    it refuses the unauthenticated PING.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


_LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


@contextmanager
def redis_under_test() -> Iterator[tuple[str, str]]:
    """The Redis to test or measure against, as ``(url, where it came from)``.

    ``CTXSTORE_REDIS_URL`` when set, else 127.0.0.1:6379 when it answers PING,
    else an :class:`~ctxstore.EmbeddedRedis` started here and stopped (its
    keys with it) on exit. The first two may be shared: write under a prefix
    of your own, and :func:`remove_keys` it before leaving.
    """
    url = os.environ.get("CTXSTORE_REDIS_URL")
    if url:
        yield url, "CTXSTORE_REDIS_URL"
    elif pings(6379):
        yield _LOCAL_REDIS_URL, "local, answering on 127.0.0.1:6379"
    else:
        with EmbeddedRedis() as server:
            yield server.url, "embedded, started for this run"


async def remove_keys(client: Redis | str, prefix: str) -> int:
    """Delete the keys under ``prefix`` and arq's keys of its jobs; return how many.

    Those are the keys matching ``{prefix}*`` (the store's keys and a summary
    queue named under the prefix) and ``arq:*{prefix}*`` (arq's job, result,
    retry and in-progress keys: a job id starts with the key prefix), found
    with SCAN and deleted 500 at a time. No other key is touched: the server
    may be shared.

    Args:
        client: A redis-py asyncio client, or a URL (a client is opened and
            closed here).
        prefix: The run's own key prefix.
    """
    if isinstance(client, str):
        owned = Redis.from_url(client)
        try:
            return await remove_keys(owned, prefix)
        finally:
            await owned.aclose()
    removed = 0
    for pattern in (f"{prefix}*", f"arq:*{prefix}*"):
        batch: list[bytes] = []
        async for key in client.scan_iter(match=pattern, count=1_000):
            batch.append(key)
            if len(batch) == 500:
                removed += int(await client.delete(*batch))
                batch.clear()
        if batch:
            removed += int(await client.delete(*batch))
    return removed


def stop_processes(processes: Iterable[BaseProcess], timeout: float = 10) -> None:
    """Stop child processes, whatever state they are in, and reap them.

    Each one started and still running gets SIGTERM, then SIGKILL if it has
    not exited ``timeout`` seconds later; every started one is joined. Ones
    never started are skipped. Safe to call twice (``finally`` blocks).
    """
    started = [p for p in processes if p.pid is not None]
    for process in started:
        if process.is_alive():
            process.terminate()
    for process in started:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()


def _command(port: int, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout


class PortTakenError(RuntimeError):
    """A node could not bind its port or its cluster bus port."""


@dataclass
class LocalCluster:
    """A real Redis Cluster on loopback ports, for tests and benchmarks.

    Started with ``redis-server --cluster-enabled yes`` and ``redis-cli
    --cluster create`` (about two seconds), in a temporary directory removed
    by :meth:`stop`. The node timeout is one second, so a killed primary is
    replaced by its replica in two or three. Needs ``redis-server`` and
    ``redis-cli`` (7 or later) on ``PATH``.


    Attributes:
        ports: Every node's port; the first half started as primaries.
        directory: Where the nodes keep their config and data.
    """

    ports: list[int]
    directory: str
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """A URL naming one node (redis-py discovers the others)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    @classmethod
    def start(cls, primaries: int = 3, replicas: int = 1) -> LocalCluster:
        """Start the nodes, create the cluster, and wait until every slot is served.

        Ports are free when chosen but another process may take one before
        its node binds it: the nodes are then stopped and the cluster started
        again on new ports, up to three times. Whatever fails, no node is
        left running.
        """
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server and redis-cli are needed for a cluster")
        attempts = 3
        while True:
            attempts -= 1
            cluster = cls(free_ports(primaries * (1 + replicas)), tempfile.mkdtemp(prefix="ctxcl-"))
            try:
                cluster._create(primaries, replicas)
                return cluster
            except PortTakenError:
                cluster.stop()
                if not attempts:
                    raise
            except BaseException:
                cluster.stop()
                raise

    def _create(self, primaries: int, replicas: int) -> None:
        """Start every node and join them into a cluster."""
        for port in self.ports:
            self.start_node(port)
        if primaries == 1 and replicas == 0:
            # redis-cli --cluster create wants three primaries: one node takes every slot.
            _command(self.ports[0], "cluster", "addslotsrange", "0", "16383")
            self.wait_ok()
            return
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        done = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(replicas),
             "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        self.wait_ok()

    def start_node(self, port: int) -> None:
        """Start (or restart) the node on ``port``."""
        node_dir = Path(self.directory) / str(port)
        node_dir.mkdir(exist_ok=True)
        try:
            self.processes[port] = start_server(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "1000", "--appendonly", "yes", "--appendfsync", "always",
                 "--save", "", "--protected-mode", "no", "--repl-diskless-sync-delay", "0",
                 "--logfile", str(node_dir / "redis.log")],
                answers=lambda: pings(port),
                log=node_dir / "redis.log",
            )  # fmt: skip
        except ServerStartError as exc:
            self.processes[port] = exc.process  # stopped: kept so the caller sees it exited
            failure = PortTakenError if exc.port_taken else RuntimeError
            raise failure(f"redis-server on {port}: {exc}") from exc

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until every live node says the cluster is ok and every replica is in sync.

        A replica that never finished its first sync cannot be promoted.
        """
        deadline = time.monotonic() + timeout
        while True:
            live = [p for p, proc in self.processes.items() if proc.poll() is None]
            replication = {p: _command(p, "info", "replication") for p in live}
            synced = all(
                "master_link_status:up" in info
                for info in replication.values()
                if "role:slave" in info
            )
            if synced and all("cluster_state:ok" in _command(p, "cluster", "info") for p in live):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become ok")
            time.sleep(0.05)

    def primaries(self) -> list[int]:
        """The ports of the nodes that are primaries now."""
        return [
            port
            for port, proc in self.processes.items()
            if proc.poll() is None and "role:master" in _command(port, "info", "replication")
        ]

    def live(self) -> int:
        """The port of a node that is running."""
        return next(p for p, proc in self.processes.items() if proc.poll() is None)

    def primary_of(self, key: str) -> int | None:
        """The port of the primary serving ``key``'s slot now (None during a failover)."""
        node = self.live()
        slot = int(_command(node, "cluster", "keyslot", key).strip())
        for line in _command(node, "cluster", "nodes").splitlines():
            parts = line.split()
            if "master" in parts[2] and "fail" not in parts[2]:
                for span in parts[8:]:
                    low, _, high = span.partition("-")
                    if low.isdigit() and int(low) <= slot <= int(high or low):
                        return int(parts[1].split(":")[1].split("@")[0])
        return None

    def replica_of(self, primary: int, timeout: float = 30) -> int:
        """The port of a replica in sync with the primary on ``primary``.

        Asked of the primary itself (``INFO replication``), not of another
        node's ``CLUSTER NODES``: gossip may not yet have told that node the
        replica's role, and a busy replica may be flagged ``fail?`` there for
        a moment. Waits up to ``timeout`` seconds for one to be online.
        """
        deadline = time.monotonic() + timeout
        while True:
            for line in _command(primary, "info", "replication").splitlines():
                if line.startswith("slave") and "state=online" in line:
                    fields = dict(part.split("=", 1) for part in line.split(":", 1)[1].split(","))
                    return int(fields["port"])
            if time.monotonic() > deadline:
                raise RuntimeError(f"{primary} has no replica in sync")
            time.sleep(0.05)

    def pause(self, port: int) -> None:
        """SIGSTOP one node (it stops answering, and replicating)."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        """SIGCONT a paused node."""
        self.processes[port].send_signal(signal.SIGCONT)

    def cut_replication(self, primary: int) -> None:
        """Drop the primary's links to its replicas (they reconnect, unless paused)."""
        _command(primary, "client", "kill", "type", "replica")

    def kill(self, port: int) -> None:
        """SIGKILL one node."""
        process = self.processes[port]
        process.kill()
        process.wait()

    def stop(self) -> None:
        """Stop every node and remove the directory."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
