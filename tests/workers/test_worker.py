"""The summary worker on real Redis: arq jobs in burst mode, processes, faults and the sweep.

Every test runs on a key prefix and an arq queue of its own (both under the
run's prefix, so conftest removes their keys): the sweep walks every tenant
under a prefix, and a burst worker runs whatever its queue holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from arq.connections import create_pool
from arq.constants import in_progress_key_prefix
from arq.jobs import Job, JobResult, JobStatus
from redis.asyncio import Redis
from support import procs
from support.config import SUMMARY_KEEP as KEEP
from support.config import SUMMARY_TRIGGER as TRIGGER
from support.helpers import SYSTEM, append_until_due, turn
from support.servers import close_worker, run_burst

import workers.jobs
import workers.worker
from ctxstore import (
    ContextStore,
    Settings,
    StoreUnavailableError,
    SummarizerError,
    SummarizerUnavailableError,
)
from ctxstore._layout.codec import RECALL_HINT
from ctxstore._layout.formats import entry_order
from ctxstore.summary_queue import SummaryQueue, deserialize, job_id
from ctxstore.testing import FakeSummarizer
from workers import build_worker, health_check_key
from workers.sweep import sweep

SPAWN = multiprocessing.get_context("spawn")
CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))

TURN_TOKENS = 38
"""Tokens in each ``helpers.turn``."""
KEPT = 60
"""Seconds arq keeps a job's result, where a test reads it (``result_of``)."""


@pytest.fixture
def wsettings(summary_settings: Settings, tenant: str) -> Settings:
    """The summary settings, with a worker name of this test's own."""
    return summary_settings.model_copy(update={"worker_name": f"worker-{tenant}"})


@pytest.fixture
async def store(wsettings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store that queues due summaries on its default queue (the worker settings')."""
    async with ContextStore.from_settings(wsettings, tenant=tenant) as store:
        yield store


@pytest.fixture
async def queue(wsettings: Settings) -> AsyncIterator[SummaryQueue]:
    """The test's summary queue, for looking at jobs and queueing more."""
    queue = await SummaryQueue.connect(wsettings)
    yield queue
    await queue.aclose()


async def result_of(queue: SummaryQueue, tenant: str, session: str, gen: int) -> JobResult:
    """Arq's kept result of one generation's job (it must have finished), read with arq."""
    settings = workers.worker.queue_redis_settings(queue.settings)
    pool = await create_pool(settings, job_deserializer=deserialize)
    try:
        job = Job(
            job_id(queue.settings, tenant, session, gen),
            pool,
            _queue_name=queue.settings.queue_name,
            _deserializer=deserialize,
        )
        info = await job.result_info()
    finally:
        await pool.aclose()
    assert info is not None, f"generation {gen} has no result"
    return info


async def expected_cover(store: ContextStore, session: str) -> tuple[int, str]:
    """How many entries a first summary covers, and the last one's id (no tool exchanges).

    The newest entries worth at least KEEP tokens stay raw.
    """
    entries = (await store.read(session)).messages
    used, cut = 0, len(entries)
    while cut > 0 and used < KEEP:
        cut -= 1
        used += entries[cut].tokens
    return cut, entries[cut - 1].entry_id


async def assert_summarized_view(
    store: ContextStore, session: str, covers: str, *, below_history: bool = True
) -> None:
    """The view: system, the summary, then every entry after ``covers``.

    Its budget is just what those need; below the history's size unless the
    summary is longer than what it covers: then the whole history fits, and
    is sent raw instead (a view never sends a summary where the raw turns fit).
    """
    history = (await store.read(session)).messages
    after = [
        s.message
        for s in history
        if entry_order(s.entry_id) > entry_order(covers) and s.message["role"] != "system"
    ]
    info = await store.info(session)
    budget = history[0].tokens + info.summary_tokens + info.tokens_unsummarized
    if below_history:
        assert budget < info.tokens
    view = await store.view(session, token_budget=budget)
    if budget >= info.tokens:
        assert not view.stats.summary_used
        assert view.messages == [s.message for s in history]
        return
    assert view.stats.summary_used
    assert view.stats.summary_covers == covers
    assert view.messages[0] == SYSTEM
    summary = view.messages[1]
    assert summary["role"] == "user"
    assert summary["content"].startswith("<summary>\n")
    assert summary["content"].endswith("\n</summary>\n" + RECALL_HINT)
    assert view.messages[2:] == after


def cli_env(settings: Settings) -> dict[str, str]:
    """The environment of a ``ctxstore`` command on these settings, with no API key."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CTXSTORE_") and k != "ANTHROPIC_API_KEY"
    }
    assert settings.redis_url is not None
    env.update(
        CTXSTORE_REDIS_URL=settings.redis_url,
        CTXSTORE_KEY_PREFIX=settings.key_prefix,
        CTXSTORE_QUEUE_NAME=settings.queue_name,
        CTXSTORE_SUMMARY_TRIGGER_TOKENS=str(settings.summary_trigger_tokens),
        CTXSTORE_SUMMARY_KEEP_TOKENS=str(settings.summary_keep_tokens),
        CTXSTORE_WORKER_NAME=settings.worker_name,
    )
    return env


async def ctxstore_cli(settings: Settings, *args: str) -> tuple[int, str]:
    """Run the ``ctxstore`` command; its exit status and output."""
    proc = await asyncio.create_subprocess_exec(
        CTXSTORE,
        *args,
        env=cli_env(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode()


# -- one job, one commit -------------------------------------------------------


async def test_crossing_the_trigger_queues_one_job_and_a_burst_worker_commits_it(
    store: ContextStore, queue: SummaryQueue, tenant: str
) -> None:
    """The append crossing the trigger queues one job; a burst worker commits a summary view."""
    await store.append("s", SYSTEM)
    next_turn = await append_until_due(store, "s")
    info = await store.info("s")
    assert info.summary_due
    assert TRIGGER <= info.tokens < TRIGGER + TURN_TOKENS  # the crossing append, not a later one
    gen = info.summary_generation
    assert await queue.depth() == 1
    assert await queue.status(tenant, "s", gen) == JobStatus.queued

    for i in range(next_turn, next_turn + 3):
        assert not (await store.append("s", turn(i))).summary_due
    assert await queue.depth() == 1
    assert (await store.info("s")).summary_generation == gen
    before = await store.get_messages("s")
    cut, covers = await expected_cover(store, "s")

    fake = FakeSummarizer()
    worker = await asyncio.wait_for(run_burst(store.settings, fake, keep_result=KEPT), 30)

    assert (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried) == (1, 0, 0)
    result = await result_of(queue, tenant, "s", gen)
    assert result.success and result.result["status"] == "committed"
    assert result.result["covers_upto"] == covers
    assert [messages for _, messages in fake.calls] == [before[1:cut]]  # system is sent anyway
    info = await store.info("s")
    assert info.summary_runs == 1
    assert not info.summary_due
    assert info.summary_covers == covers
    assert info.summary_model == "fake"
    assert KEEP <= info.tokens_unsummarized <= KEEP + TURN_TOKENS
    assert await queue.depth() == 0
    await assert_summarized_view(store, "s", covers)
    assert await store.get_messages("s") == before  # the raw stream is never rewritten


async def test_a_separate_worker_process_commits_the_summary(
    store: ContextStore, queue: SummaryQueue, tenant: str
) -> None:
    """`ctxstore worker --burst`, configured by CTXSTORE_* only, commits a local summary."""
    await store.append("s", SYSTEM)
    await append_until_due(store, "s")
    gen = (await store.info("s")).summary_generation
    before = await store.get_messages("s")
    _, covers = await expected_cover(store, "s")

    code, out = await ctxstore_cli(store.settings, "worker", "--burst")

    assert code == 0, out
    # The command's worker keeps no arq result (the outcome is on the session).
    assert await queue.status(tenant, "s", gen) == JobStatus.not_found
    info = await store.info("s")
    assert info.summary_runs == 1
    assert info.summary_last_outcome == "committed"
    assert not info.summary_due
    assert info.summary_covers == covers
    assert info.summary_model == "local-ledger"
    # The extractive summary of these repetitive turns is longer than what it covers.
    await assert_summarized_view(store, "s", covers, below_history=False)
    assert await store.get_messages("s") == before


async def test_a_view_right_after_a_commit_queues_no_new_job(
    store: ContextStore, queue: SummaryQueue
) -> None:
    """After a commit, a view whose budget holds everything sends it raw and queues nothing."""
    await store.append("s", SYSTEM)
    next_turn = await append_until_due(store, "s")
    await asyncio.wait_for(run_burst(store.settings, FakeSummarizer()), 30)
    await store.append("s", turn(next_turn))
    info = await store.info("s")
    assert info.summary_runs == 1 and not info.summary_due
    assert info.tokens_unsummarized < TRIGGER

    view = await store.view("s")  # the default budget holds everything

    assert not view.stats.summary_used
    assert view.messages == await store.get_messages("s")
    assert await queue.depth() == 0
    assert not (await store.info("s")).summary_due


# -- faults ----------------------------------------------------------------------


async def gated_job(store: ContextStore) -> tuple[int, asyncio.Event, FakeSummarizer]:
    """Session "s" made due: its generation, and a summarizer that waits for the gate."""
    await store.append("s", SYSTEM)
    await append_until_due(store, "s")
    gate = asyncio.Event()
    return (await store.info("s")).summary_generation, gate, FakeSummarizer(gate=gate)


async def test_a_replace_during_the_job_refuses_its_commit(
    store: ContextStore, queue: SummaryQueue, tenant: str
) -> None:
    """A replace while the summarizer runs: its commit is refused; views truncate."""
    gen, gate, fake = await gated_job(store)
    running = asyncio.create_task(run_burst(store.settings, fake, keep_result=KEPT))
    try:
        await asyncio.wait_for(fake.started.wait(), 60)  # a safety net
        new_history = [SYSTEM, *(turn(i) for i in range(100, 112))]
        await store.replace("s", new_history)  # a writer takes the lease from the worker
    finally:
        gate.set()
        await asyncio.wait_for(running, 30)

    result = await result_of(queue, tenant, "s", gen)
    assert result.success
    assert result.result["status"] in {"stale", "lease_lost"}
    assert len(fake.calls) == 1
    info = await store.info("s")
    assert info.epoch == 1
    assert info.summary_covers is None
    assert info.summary_runs == 0
    assert info.tokens_unsummarized == info.tokens
    budget = info.tokens - 3 * TURN_TOKENS
    view = await store.view("s", token_budget=budget)
    assert not view.stats.summary_used
    assert view.stats.dropped > 0
    assert view.stats.tokens <= budget
    kept = len(view.messages) - 1
    assert view.messages == [SYSTEM, *new_history[-kept:]]
    assert await store.get_messages("s") == new_history


JOB_TIMEOUT = 2.0
"""The killed worker's job timeout: arq runs its job again JOB_TIMEOUT + 10 s after it began."""


async def test_a_job_whose_worker_was_killed_is_run_again_and_commits(
    store: ContextStore, queue: SummaryQueue, tenant: str, redis_url: str, raw_redis: Redis
) -> None:
    """SIGKILL a worker mid-job: job_timeout + 10 s later, another worker commits the job."""
    await store.append("s", SYSTEM)
    await append_until_due(store, "s")
    gen = (await store.info("s")).summary_generation
    before = await store.get_messages("s")
    cut, covers = await expected_cover(store, "s")
    signal_key = f"{store.settings.key_prefix}:stuck-started"
    overrides = {
        "summary_trigger_tokens": TRIGGER,
        "summary_keep_tokens": KEEP,
        "lease_ttl_seconds": 2.0,  # the dead worker's lease must lapse before the rerun
    }
    process = SPAWN.Process(
        target=procs.stuck_worker,
        args=(redis_url, store.settings.key_prefix, overrides, JOB_TIMEOUT, signal_key),
    )
    process.start()
    try:
        async with asyncio.timeout(30):
            while not await raw_redis.exists(signal_key):  # noqa: ASYNC110 - waits on a condition
                await asyncio.sleep(0.01)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=10)
    assert process.exitcode == -signal.SIGKILL
    # Killed before arq could finish, fail or time the job out: it is still in progress.
    assert await queue.status(tenant, "s", gen) == JobStatus.in_progress
    assert await queue.depth() == 1
    in_progress = in_progress_key_prefix + job_id(store.settings, tenant, "s", gen)
    assert 0 < await raw_redis.pttl(in_progress) <= (JOB_TIMEOUT + 10) * 1000

    fake = FakeSummarizer()
    async with asyncio.timeout(40):
        while (await store.info("s")).summary_runs < 1:
            await run_burst(store.settings, fake, keep_result=KEPT)

    assert not await raw_redis.exists(in_progress)
    result = await result_of(queue, tenant, "s", gen)
    assert result.success and result.result["status"] == "committed"
    assert result.job_try == 2  # the same job, run again
    assert [messages for _, messages in fake.calls] == [before[1:cut]]
    info = await store.info("s")
    assert info.summary_runs == 1
    assert info.summary_covers == covers
    assert not info.summary_due
    await assert_summarized_view(store, "s", covers)


async def test_two_workers_on_one_session_commit_once_per_coverage_point(
    store: ContextStore, queue: SummaryQueue, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers on one session's generations: contention is arq retries, one commit per point."""
    monkeypatch.setattr(workers.jobs, "retry_delay", lambda job_try, retry_after=None: 0.1)
    await store.append("s", SYSTEM)
    next_turn = await append_until_due(store, "s")
    gens = [(await store.info("s")).summary_generation]
    for _ in range(2):
        for i in range(next_turn, next_turn + 3):
            await store.append("s", turn(i))
        next_turn += 3
        gen = await store.request_summary("s", force=True)
        assert await queue.enqueue(tenant, "s", gen)
        gens.append(gen)
    assert await queue.depth() == 3

    gate = asyncio.Event()
    fake = FakeSummarizer(gate=gate)
    pair = [
        build_worker(store.settings, summarizer=fake, burst=True, keep_result=KEPT)
        for _ in range(2)
    ]
    running = asyncio.gather(*(w.main() for w in pair))
    try:
        await asyncio.wait_for(fake.started.wait(), 60)  # a safety net
        async with asyncio.timeout(60):  # a safety net: waits on a condition
            while sum(w.jobs_retried for w in pair) < 1:  # noqa: ASYNC110 - waits on a condition
                await asyncio.sleep(0.01)
        # More than the trigger arrives mid-job: the commit must hand out the next generation.
        for i in range(next_turn, next_turn + 11):
            await store.append("s", turn(i))
        gate.set()
        await asyncio.wait_for(running, 30)
    finally:
        gate.set()
        for w in pair:
            await close_worker(w)

    results = []
    pending = list(gens)
    while pending:
        result = await result_of(queue, tenant, "s", pending.pop(0))
        assert result.success, result
        results.append(result)
        if result.result["next_generation"]:
            pending.append(result.result["next_generation"])
    commits = [r.result for r in results if r.result["status"] == "committed"]
    assert {r.result["status"] for r in results} <= {"committed", "idle"}
    covers = [c["covers_upto"] for c in commits]
    info = await store.info("s")
    assert len(commits) >= 2
    assert len(set(covers)) == len(commits) == info.summary_runs == len(fake.calls)
    newest = max(covers, key=entry_order)
    assert info.summary_covers == newest
    assert sum(w.jobs_retried for w in pair) >= 1
    assert any(r.job_try > 1 for r in results)
    assert sum(w.jobs_failed for w in pair) == 0
    await assert_summarized_view(store, "s", newest)


async def test_a_summarizer_that_fails_for_good_fails_the_job_and_views_truncate(
    store: ContextStore, queue: SummaryQueue, tenant: str
) -> None:
    """A permanent SummarizerError: one try, recorded on the session; views keep truncating."""
    await store.append("s", SYSTEM)
    await append_until_due(store, "s")
    gen = (await store.info("s")).summary_generation
    fake = FakeSummarizer(fail=[SummarizerError("boom: bad request")] * 3)

    worker = await asyncio.wait_for(run_burst(store.settings, fake, keep_result=KEPT), 30)

    assert (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried) == (0, 1, 0)
    assert len(fake.calls) == 1
    result = await result_of(queue, tenant, "s", gen)
    assert not result.success
    assert result.job_try == 1
    info = await store.info("s")
    assert info.summary_failures == 1
    assert info.summary_error is not None and "boom" in info.summary_error
    assert info.summary_failed_at_ms is not None
    assert info.summary_runs == 0
    assert info.summary_covers is None
    assert info.summary_due  # left up for the sweep, after summary_retry_seconds
    budget = info.tokens - 3 * TURN_TOKENS
    view = await store.view("s", token_budget=budget)
    assert not view.stats.summary_used
    assert view.stats.dropped > 0
    assert view.stats.tokens <= budget
    history = await store.get_messages("s")
    assert view.messages == [SYSTEM, *history[-(len(view.messages) - 1) :]]


async def test_an_unavailable_summarizer_is_retried_until_it_commits(
    store: ContextStore, queue: SummaryQueue, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SummarizerUnavailableError twice: arq retries the job (try 3 commits)."""
    monkeypatch.setattr(workers.jobs, "retry_delay", lambda job_try, retry_after=None: 0.01)
    await store.append("s", SYSTEM)
    await append_until_due(store, "s")
    gen = (await store.info("s")).summary_generation
    _, covers = await expected_cover(store, "s")
    fake = FakeSummarizer(fail=[SummarizerUnavailableError("529 overloaded")] * 2)

    worker = await asyncio.wait_for(run_burst(store.settings, fake, keep_result=KEPT), 30)

    assert (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried) == (1, 0, 2)
    assert len(fake.calls) == 3
    result = await result_of(queue, tenant, "s", gen)
    assert result.success and result.result["status"] == "committed"
    assert result.job_try == 3
    info = await store.info("s")
    assert info.summary_runs == 1
    assert info.summary_failures == 2  # each unavailable try is recorded
    assert info.summary_error is None  # and cleared by the commit
    assert info.summary_covers == covers
    await assert_summarized_view(store, "s", covers)


async def test_a_commit_whose_next_job_cannot_be_queued_succeeds_and_the_sweep_queues_it(
    store: ContextStore,
    queue: SummaryQueue,
    tenant: str,
    raw_redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The summary is committed: a queue that then fails costs a delay, not a failed job."""
    gen, gate, fake = await gated_job(store)
    worker = build_worker(store.settings, summarizer=fake, burst=True, keep_result=KEPT)
    running = asyncio.create_task(worker.main())
    try:
        await asyncio.wait_for(fake.started.wait(), 60)  # a safety net
        # More than the trigger arrives mid-job: the commit hands out the next generation.
        for i in range(100, 111):
            await store.append("s", turn(i))

        async def unreachable(self: SummaryQueue, *args: object) -> bool:
            raise StoreUnavailableError("the queue did not answer")

        monkeypatch.setattr(SummaryQueue, "enqueue", unreachable)
        gate.set()
        await asyncio.wait_for(running, 30)
    finally:
        gate.set()
        await close_worker(worker)
    monkeypatch.undo()

    assert (worker.jobs_complete, worker.jobs_failed) == (1, 0)
    result = await result_of(queue, tenant, "s", gen)
    assert result.success and result.result["status"] == "committed"
    following = result.result["next_generation"]
    assert following
    assert "next summary job not queued" in caplog.text
    info = await store.info("s")
    assert info.summary_due and info.summary_generation == following
    assert await queue.depth() == 0
    # Past its grace, the sweep queues the generation the commit handed out.
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    await raw_redis.hset(store.keys("s").meta, "sq_at", an_hour_ago)
    report = await sweep(store, queue)
    assert report.queued == 1
    assert await queue.depth() == 1


# -- the sweep and the health check ------------------------------------------------


async def test_the_sweep_queues_a_lost_job_once_and_leaves_a_live_one_waiting(
    store: ContextStore, queue: SummaryQueue, tenant: str, raw_redis: Redis
) -> None:
    """A flag up with no job, past the grace: the sweep queues it; a queued job is left waiting."""
    quiet = store.settings.model_copy(update={"summary_trigger_tokens": 0})
    async with ContextStore.from_settings(quiet, tenant=tenant) as no_summaries:
        await no_summaries.append_many("lost", [SYSTEM, *(turn(i) for i in range(14))])
    lost_gen = await store.request_summary("lost")  # the pod died before its enqueue
    assert lost_gen > 0
    await store.append("live", SYSTEM)
    await append_until_due(store, "live")
    live_gen = (await store.info("live")).summary_generation
    assert await queue.depth() == 1
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    for session in ("lost", "live"):
        await raw_redis.hset(store.keys(session).meta, "sq_at", an_hour_ago)

    report = await sweep(store, queue)

    assert (report.sessions, report.queued, report.waiting) == (2, 1, 1)
    assert await queue.depth() == 2
    requeued = (await store.info("lost")).summary_generation
    assert requeued > lost_gen
    assert await queue.status(tenant, "lost", requeued) == JobStatus.queued
    assert (await store.info("live")).summary_generation == live_gen
    again = await sweep(store, queue)
    assert (again.queued, again.waiting) == (0, 2)
    assert await queue.depth() == 2

    fake = FakeSummarizer()
    worker = await asyncio.wait_for(run_burst(store.settings, fake), 30)

    assert (worker.jobs_complete, worker.jobs_failed) == (2, 0)
    for session in ("lost", "live"):
        info = await store.info(session)
        assert (info.summary_runs, info.summary_due) == (1, False), session
        _, covers = await expected_cover(store, session)
        assert info.summary_covers == covers


async def test_worker_check_exits_0_while_the_worker_runs_and_1_after_it_stops(
    wsettings: Settings, raw_redis: Redis
) -> None:
    """`ctxstore worker --check` is 0 while the worker's health key is fresh, 1 once it stopped."""
    key = health_check_key(wsettings)
    worker = build_worker(wsettings, summarizer=FakeSummarizer())
    running = asyncio.create_task(worker.async_run())
    try:
        async with asyncio.timeout(60):  # a safety net: waits on a condition
            while not await raw_redis.exists(key):
                assert not running.done()
                await asyncio.sleep(0.05)
        code, out = await ctxstore_cli(wsettings, "worker", "--check")
        assert code == 0, out
        assert "j_complete=" in out
    finally:
        worker.handle_sig(signal.SIGTERM)
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await close_worker(worker)

    assert not await raw_redis.exists(key)
    code, out = await ctxstore_cli(wsettings, "worker", "--check")
    assert code == 1, out
    assert f"no health check at {key}" in out


@pytest.mark.parametrize("indexing", [True, False])
async def test_the_worker_brings_the_search_index_up_to_date(
    wsettings: Settings, tenant: str, indexing: bool
) -> None:
    """After its summary job, the worker has indexed the whole history (unless told not to)."""
    settings = wsettings.model_copy(update={"search_index": indexing})
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await store.append("s", SYSTEM)
        await append_until_due(store, "s")
        worker = await asyncio.wait_for(run_burst(settings, FakeSummarizer()), 30)
        assert worker.jobs_complete == 1
        count = (await store.info("s")).count
        # A search then has nothing left to index when the worker did it.
        assert await store.index("s") == (0 if indexing else count)
