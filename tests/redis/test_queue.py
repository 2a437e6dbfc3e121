"""The summary queue's own Redis: Sentinel URLs, and a queue that is down or hangs.

A down queue must cost an append one bounded attempt, never a hang and never
one attempt per session: the session's summary flag stays up, and the
workers' sweep queues it later. Servers are private (a loopback port and a
temp dir each); the store's keys are under the run's prefix.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from support.helpers import append_until_due
from support.servers import PrivateRedis, ServerPool, run_burst

import ctxstore.summary_queue
from ctxstore import ConfigurationError, ContextStore, Settings, StoreUnavailableError
from ctxstore.settings import SentinelAddress, sentinel_address
from ctxstore.summary_queue import QUEUE_BACKOFF_MS, SummaryQueue, job_id
from ctxstore.testing import FakeSummarizer, ManualClock, free_port


@pytest.fixture
def qsettings(summary_settings: Settings) -> Settings:
    """The summary settings, with short timeouts (a down queue is noticed in 0.5 s)."""
    return summary_settings.model_copy(update={"connect_timeout": 0.5, "operation_timeout": 0.5})


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every connection the queue opens, counted (the real one is made)."""
    calls: list[object] = []
    real = ctxstore.summary_queue.queue_connection

    def counted(settings: Settings) -> Any:
        calls.append(settings)
        return real(settings)

    monkeypatch.setattr(ctxstore.summary_queue, "queue_connection", counted)
    return calls


async def queued(url: str, queue_name: str) -> int:
    """Jobs in the queue on the Redis at ``url``."""
    client = Redis.from_url(url)
    try:
        return int(await client.zcard(queue_name))
    finally:
        await client.aclose()


# -- URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+sentinel://s1/queue", SentinelAddress((("s1", 26379),), "queue")),
        (
            "redis+sentinel://s1:1,s2:2,[::1]:3/queue/4",
            SentinelAddress((("s1", 1), ("s2", 2), ("::1", 3)), "queue", 4),
        ),
        (
            "redis+sentinel://pod:p%40ss%3Aword@s1/my%20queue",
            SentinelAddress((("s1", 26379),), "my queue", 0, "pod", "p@ss:word"),
        ),
        (
            "redis+sentinel://:secret@s1/q",
            SentinelAddress((("s1", 26379),), "q", 0, None, "secret"),
        ),
        ("REDIS+SENTINEL://s1/q", SentinelAddress((("s1", 26379),), "q")),
    ],
)
def test_sentinel_urls_give_their_parts(url: str, expected: SentinelAddress) -> None:
    """Hosts (default port 26379), master, db and percent-decoded credentials."""
    assert sentinel_address(url) == expected


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h/1", "unix:///tmp/r.sock"])
def test_other_urls_are_not_sentinel_urls(url: str) -> None:
    """A plain Redis URL is left to arq's own parser."""
    assert sentinel_address(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1",
        "redis+sentinel://s1/",
        "redis+sentinel:///queue",
        "redis+sentinel://s1,,s2/queue",
        "redis+sentinel://s1:99999/queue",
        "redis+sentinel://s1:port/queue",
        "redis+sentinel://s1/queue/zero",
        "redis+sentinel://s1/queue/1/2",
        "redis+sentinel://s1/queue/١",
    ],
)
def test_a_malformed_sentinel_url_is_a_configuration_error(url: str) -> None:
    """Each malformed part is refused, with a typed error, before any connection."""
    with pytest.raises(ConfigurationError):
        sentinel_address(url)
    with pytest.raises(ConfigurationError, match="CTXSTORE_QUEUE_URL"):
        Settings(queue_url=url)


def test_a_refused_queue_url_does_not_echo_its_password() -> None:
    """URLs carry passwords: the error names the field, not the value."""
    with pytest.raises(ConfigurationError) as refused:
        Settings(queue_url="http://pod:hunter2@queue:6379/0")
    assert "queue_url" in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_arq_gets_the_sentinels_and_a_request_path_never_retries_a_connection() -> None:
    """The SDK's queue connects once; a starting worker waits for its Redis."""
    pytest.importorskip("arq", reason="the summary worker needs ctxstore[worker]")
    from workers import worker_options
    from workers.worker import STARTUP_CONN_RETRIES, queue_redis_settings

    settings = Settings(queue_url="redis+sentinel://pod:pw@s1,s2:26380/queue/3")
    arq = queue_redis_settings(settings)
    assert arq.sentinel and arq.sentinel_master == "queue"
    assert arq.host == [("s1", 26379), ("s2", 26380)]
    assert (arq.database, arq.username, arq.password) == (3, "pod", "pw")
    assert arq.conn_retries == 0
    worker = worker_options(settings, summarizer=FakeSummarizer())["redis_settings"]
    assert worker.sentinel and worker.conn_retries == STARTUP_CONN_RETRIES


def test_a_burst_worker_runs_no_sweep_and_a_standing_one_sweeps_from_its_start() -> None:
    """A burst's job count is its queue's: a sweep would join it only when it spans :00."""
    pytest.importorskip("arq", reason="the summary worker needs ctxstore[worker]")
    from workers import worker_options

    settings = Settings(redis_url="redis://127.0.0.1:6379/0")  # options only: none connects
    assert worker_options(settings, summarizer=FakeSummarizer(), burst=True)["cron_jobs"] == []
    (cron,) = worker_options(settings, summarizer=FakeSummarizer())["cron_jobs"]
    assert (cron.second, cron.run_at_startup, cron.unique) == (0, True, True)


# -- Sentinel -----------------------------------------------------------------------------


async def test_a_store_queues_through_sentinel_and_a_worker_serves_the_queue(
    qsettings: Settings, tenant: str, servers: ServerPool
) -> None:
    """Store on the shared Redis, queue on a primary found through Sentinel: a summary commits."""
    primary = servers.start()
    sentinel = servers.start_sentinel(primary)
    settings = qsettings.model_copy(update={"queue_url": sentinel.sentinel_url()})

    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await append_until_due(store, "s")
        assert await queued(primary.url(), settings.queue_name) == 1  # on the primary
        worker = await asyncio.wait_for(run_burst(settings, FakeSummarizer()), 60)
        assert (worker.jobs_complete, worker.jobs_failed) == (1, 0)
        info = await store.info("s")
        assert (info.summary_runs, info.summary_due) == (1, False)
        view = await store.view("s", token_budget=info.tokens - 1)  # the summary is needed
        assert view.stats.summary_used
    assert await queued(primary.url(), settings.queue_name) == 0


# -- A queue that is down, or hangs --------------------------------------------------------


async def test_a_down_queue_costs_one_attempt_then_appends_leave_it_to_the_sweep(
    qsettings: Settings, tenant: str, connects: list[object]
) -> None:
    """Nothing listens on the queue's port: appends succeed, flags stay up, one try per backoff."""
    settings = qsettings.model_copy(update={"queue_url": f"redis://127.0.0.1:{free_port()}/0"})
    clock = ManualClock(int(time.time() * 1000))
    async with ContextStore.from_settings(settings, tenant=tenant, clock=clock) as store:
        await append_until_due(store, "a")
        assert len(connects) == 1
        await append_until_due(store, "b")
        assert len(connects) == 1  # within the backoff: not tried
        clock.advance(QUEUE_BACKOFF_MS / 1000)
        await append_until_due(store, "c")
        assert len(connects) == 2  # tried again once the backoff is over
        for session in ("a", "b", "c"):
            info = await store.info(session)
            assert info.summary_due, session  # the sweep's cue
            assert info.count > 0


async def test_a_queue_that_stops_answering_does_not_hang_the_append(
    qsettings: Settings, tenant: str, servers: ServerPool
) -> None:
    """A paused queue Redis: the crossing append returns after ``operation_timeout``, stored."""
    queue_redis: PrivateRedis = servers.start()
    settings = qsettings.model_copy(update={"queue_url": queue_redis.url()})
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await append_until_due(store, "before")  # opens the pool and queues a job
        assert await queued(queue_redis.url(), settings.queue_name) == 1
        queue_redis.pause()
        try:
            async with asyncio.timeout(20):  # fails the test instead of hanging it
                await append_until_due(store, "during")
        finally:
            queue_redis.resume()
        info = await store.info("during")
        assert info.summary_due and info.count > 0
        # The timed-out enqueue was sent: the resumed server may still run it. Either
        # way, no job but these two generations' (none doubled), and the sweep's cue is up.
        client = Redis.from_url(queue_redis.url())
        try:
            jobs = {m.decode() for m in await client.zrange(settings.queue_name, 0, -1)}
        finally:
            await client.aclose()
        before = (await store.info("before")).summary_generation
        expected = {job_id(settings, tenant, s, g) for s, g in (("before", before),)}
        assert (
            expected
            <= jobs
            <= expected | {job_id(settings, tenant, "during", info.summary_generation)}
        )


async def test_a_queue_paused_before_it_is_opened_fails_fast_and_typed(
    qsettings: Settings, servers: ServerPool
) -> None:
    """Connecting to a Redis that accepts but never answers: StoreUnavailableError, no hang."""
    queue_redis = servers.start()
    settings = qsettings.model_copy(update={"queue_url": queue_redis.url()})
    queue_redis.pause()
    try:
        async with asyncio.timeout(20):
            with pytest.raises(StoreUnavailableError, match="summary queue"):
                await SummaryQueue.connect(settings)
    finally:
        queue_redis.resume()
