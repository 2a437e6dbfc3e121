"""Prometheus metrics: what a pod and a worker serve at /metrics, checked against what happened.

Each test records to a registry of its own and reads it the way Prometheus
does: over HTTP from the server ``ctxstore.metrics.serve`` (or ``ctxstore
worker --metrics-port``) starts, parsed from the exposition format.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import astuple
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support.config import SUMMARY_KEEP as KEEP
from support.helpers import SYSTEM, append_until_due, oa_call, oa_result, turn, user

from ctxstore import (
    ConflictError,
    ContextStore,
    InvalidIdError,
    MessageTooLargeError,
    QuotaExceededError,
    RequestView,
    Settings,
)
from ctxstore.errors import StoreUnavailableError
from ctxstore.metrics import (
    LATENCY_BUCKETS,
    OPERATIONS,
    TOKEN_BUCKETS,
    Metrics,
    error_kind,
    metrics_for,
    serve,
)
from ctxstore.models import ViewStats
from ctxstore.testing import FakeSummarizer, free_port

needs_arq = pytest.mark.skipif(
    importlib.util.find_spec("arq") is None, reason="the summary worker needs ctxstore[worker]"
)
CTXSTORE = str(Path(sys.executable).with_name("ctxstore"))

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist (a counter never incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def ours(samples: Samples) -> Samples:
    """The samples of ctxstore's own metrics (not the process's)."""
    return {key: v for key, v in samples.items() if key[0].startswith("ctxstore_")}


def scrape_url(url: str) -> str:
    with urlopen(url, timeout=5) as answer:
        assert answer.status == 200
        return str(answer.read().decode())


async def scrape(registry: CollectorRegistry) -> Samples:
    """What Prometheus reads from ``serve(port, registry=registry)``."""
    server = serve(0, "127.0.0.1", registry=registry)
    try:
        text = await asyncio.to_thread(scrape_url, f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()
    return parse(text)


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of this test's own."""
    return CollectorRegistry()


@pytest.fixture
async def store(
    settings: Settings, tenant: str, registry: CollectorRegistry
) -> AsyncIterator[ContextStore]:
    """A store recording to the test's registry: small message cap, session quota, offloads."""
    small = settings.model_copy(
        update={
            "max_message_bytes": 2_000,
            "session_tokens": 300,
            "offload_threshold_tokens": 100,
            "offload_preview_tokens": 30,
        }
    )
    async with ContextStore.from_settings(small, tenant=tenant, registry=registry) as store:
        yield store


def tool_exchange(i: int, result_tokens: int) -> list[dict[str, Any]]:
    """An assistant call and its (large) result."""
    return [
        oa_call(f"c{i}"),
        oa_result(f"c{i}", " ".join(["data"] * result_tokens)),
    ]


# -- a pod -------------------------------------------------------------------------


async def test_a_pods_workload_is_counted_as_it_happened(
    store: ContextStore, registry: CollectorRegistry
) -> None:
    """Appends, duplicates, views and their stats, refusals and errors: each counted exactly."""
    for i in range(7):
        await store.append("s", turn(i), idempotency_key=f"k{i}")
    assert (await store.append("s", turn(3), idempotency_key="k3")).duplicate
    with pytest.raises(QuotaExceededError) as refused:
        await store.append("s", turn(99))  # 8 turns of 38 tokens: past session_tokens (300)
    assert refused.value.quota == "session_tokens"
    with pytest.raises(MessageTooLargeError):
        await store.append("big", user("x" * 3_000))
    with pytest.raises(InvalidIdError):
        await store.view("no/such:id")
    # An orphan tool result (repaired), one too large for its budget (offloaded), a tight
    # budget (drops), and a system message larger than its budget (over budget).
    await store.append_many("t", [user("q"), oa_result("ghost", "lost"), *tool_exchange(1, 150)])
    await store.append("p", {"role": "system", "content": "be careful " * 40})
    views: list[RequestView] = []
    for budget in (5_000, 120):
        views.append(await store.view("s", token_budget=budget))
    views.append(await store.view("t", token_budget=150))  # the history does not fit
    views.append(await store.view("p", token_budget=20))

    got = await scrape(registry)

    assert value(got, "ctxstore_appends_total") == 7 + 4 + 1
    assert value(got, "ctxstore_append_duplicates_total") == 1
    calls = "ctxstore_operation_duration_seconds_count"
    assert value(got, calls, operation="append") == 7 + 1 + 2 + 1 + 1
    assert value(got, calls, operation="view") == len(views) + 1
    errors = "ctxstore_operation_errors_total"
    assert value(got, errors, operation="append", error="QuotaExceededError") == 1
    assert value(got, errors, operation="append", error="MessageTooLargeError") == 1
    assert value(got, errors, operation="view", error="InvalidIdError") == 1
    assert value(got, "ctxstore_quota_refusals_total", quota="session_tokens") == 1
    assert value(got, "ctxstore_quota_refusals_total", quota="message_bytes") == 1

    stats = [v.stats for v in views]
    assert value(got, "ctxstore_view_tokens_count") == len(views)
    assert value(got, "ctxstore_view_tokens_sum") == sum(s.tokens for s in stats)
    assert value(got, "ctxstore_view_budget_fill_ratio_sum") == pytest.approx(
        sum(s.tokens / s.budget_cl100k for s in stats)
    )
    for name, expected in (
        ("ctxstore_view_dropped_messages_total", sum(s.dropped for s in stats)),
        ("ctxstore_view_offloaded_messages_total", sum(len(s.offloaded) for s in stats)),
        ("ctxstore_view_repairs_total", sum(len(s.repairs) for s in stats)),
        ("ctxstore_view_over_budget_total", sum(s.over_budget for s in stats)),
    ):
        assert expected > 0, f"the workload must exercise {name}"
        assert value(got, name) == expected, name
    assert value(got, "ctxstore_view_summary_used_total") == 0


async def test_rewrites_and_their_errors_are_counted_by_operation(
    store: ContextStore, registry: CollectorRegistry
) -> None:
    """Replace, clear, pop and delete are timed; a stale expected_seq counts as ConflictError."""
    await store.append_many("s", [user("a"), user("b")])
    await store.replace("s", [user("c")])
    with pytest.raises(ConflictError) as stale:
        await store.replace("s", [user("d")], expected_seq=99)
    await store.pop("s")
    await store.clear("s")
    await store.delete("s")

    got = await scrape(registry)

    calls = "ctxstore_operation_duration_seconds_count"
    assert [value(got, calls, operation=op) for op in ("replace", "clear", "pop", "delete")] == [
        2,
        1,
        1,
        1,
    ]
    kind = error_kind(stale.value)
    assert kind == "ConflictError"
    assert value(got, "ctxstore_operation_errors_total", operation="replace", error=kind) == 1
    assert value(got, "ctxstore_appends_total") == 2


async def test_metrics_off_records_nothing(settings: Settings, tenant: str) -> None:
    """With ``metrics=False`` a store records nothing to the registry it is given."""
    registry = CollectorRegistry()
    off = settings.model_copy(update={"metrics": False})
    async with ContextStore.from_settings(off, tenant=tenant, registry=registry) as store:
        await store.append("s", user("hi"))
        await store.view("s")
    assert ours(await scrape(registry)) == {}


def test_error_kinds_are_a_bounded_set() -> None:
    """The error label is a ctxstore or built-in class name; anything else is ``other``."""

    class Mine(Exception):
        pass

    class Yours(StoreUnavailableError):
        pass

    assert error_kind(StoreUnavailableError("down")) == "StoreUnavailableError"
    assert error_kind(Yours("down")) == "StoreUnavailableError"
    assert error_kind(TimeoutError()) == "TimeoutError"
    assert error_kind(Mine("with a message")) == "Exception"
    dynamic = [type(f"E{i}", (BaseException,), {}) for i in range(1_000)]
    assert {error_kind(cls()) for cls in dynamic} == {"BaseException"}


# -- labels: no content, bounded ---------------------------------------------------


SECRET_TEXT = "the launch code is 0000-SECRET-TEXT"
SECRET_KEY = "sk-ant-SECRET-API-KEY"
SESSION = "session-SECRET-ID"


def label_values(registry: CollectorRegistry) -> list[tuple[str, str, str]]:
    """(metric, label, value) of every sample in the registry."""
    return [
        (sample.name, label, str(v))
        for family in registry.collect()
        for sample in family.samples
        for label, v in sample.labels.items()
    ]


@pytest.mark.parametrize("tenant_labels", [False, True])
async def test_no_label_carries_content_keys_ids_or_secrets(
    settings: Settings, tenant: str, tenant_labels: bool
) -> None:
    """No label value holds a message, a key, a session id, a secret (a tenant only if asked)."""
    registry = CollectorRegistry()
    secretive = settings.model_copy(
        update={
            "anthropic_api_key": SECRET_KEY,
            "metrics_tenant_labels": tenant_labels,
            "max_message_bytes": 2_000,
        }
    )
    async with ContextStore.from_settings(secretive, tenant=tenant, registry=registry) as store:
        await store.append(SESSION, user(SECRET_TEXT), idempotency_key="idem-SECRET-KEY")
        await store.append_many(SESSION, [oa_result("orphan-SECRET", SECRET_TEXT)])
        await store.view(SESSION, token_budget=40)
        with pytest.raises(MessageTooLargeError):
            await store.append(SESSION, user(SECRET_TEXT * 100))
        await store.replace(SESSION, [user(SECRET_TEXT)])
        await store.summarize(SESSION, FakeSummarizer(name="fake"))
        keys = store.keys(SESSION)
    forbidden = ["SECRET", SESSION, secretive.key_prefix, *map(str, astuple(keys))]
    found = label_values(registry)
    assert found
    for metric, label, text in found:
        for bad in forbidden:
            assert bad not in text, (metric, label, text)
        if label == "tenant":
            assert tenant_labels and text == tenant
        else:
            assert tenant not in text, (metric, label)
    assert any(label == "tenant" for _, label, _ in found) == tenant_labels


async def test_label_cardinality_stays_bounded_with_10000_sessions(
    settings: Settings, tenant: str
) -> None:
    """Views of 10,000 sessions add no series: the registry holds as many as after 10."""
    registry = CollectorRegistry()
    async with ContextStore.from_settings(settings, tenant=tenant, registry=registry) as store:

        async def view_all(sessions: Iterable[str]) -> None:
            batch = list(sessions)
            for start in range(0, len(batch), 20):
                await asyncio.gather(*(store.view(s) for s in batch[start : start + 20]))

        await view_all(f"s{i}" for i in range(10))
        with pytest.raises(InvalidIdError):
            await store.view("bad id 0")
        series = len(label_values(registry))
        await view_all(f"s{i}" for i in range(10, 10_000))
        for i in range(1, 50):
            with pytest.raises(InvalidIdError):
                await store.view(f"bad id {i}")

    got = await scrape(registry)
    assert value(got, "ctxstore_operation_duration_seconds_count", operation="view") == 10_050
    assert len(label_values(registry)) == series


def test_tenant_labels_give_one_series_per_tenant_and_no_more() -> None:
    """With tenant labels, 10,000 sessions of 3 tenants make 3 series per metric, not 10,000."""
    registry = CollectorRegistry()
    metrics = metrics_for(registry, tenant_labels=True)
    for i in range(10_000):
        metrics.record_operation("view", f"tenant{i % 3}", 0.001, None)
        metrics.record_job(f"tenant{i % 3}", "committed", 0.5)
    metrics.record_sample(4, [(f"tenant{i % 3}", i) for i in range(10_000)])
    tenants = {v for _, label, v in label_values(registry) if label == "tenant"}
    assert tenants == {"tenant0", "tenant1", "tenant2"}
    families = {f.name: f for f in registry.collect()}
    count = families["ctxstore_operation_duration_seconds"].samples
    assert len({s.labels["tenant"] for s in count}) == 3
    lag_max = families["ctxstore_summary_lag_tokens_max"].samples
    assert {s.labels["tenant"]: s.value for s in lag_max} == {
        "tenant0": 9_999,
        "tenant1": 9_997,
        "tenant2": 9_998,
    }
    metrics.record_sample(0, [("tenant1", 5)])
    lag_max = {f.name: f for f in registry.collect()}["ctxstore_summary_lag_tokens_max"].samples
    assert [(s.labels["tenant"], s.value) for s in lag_max] == [("tenant1", 5)]


def test_a_registry_keeps_one_choice_of_tenant_labels() -> None:
    """Asking a registry's metrics with the other tenant_labels is refused, not half-built."""
    from ctxstore import ConfigurationError

    registry = CollectorRegistry()
    assert metrics_for(registry) is metrics_for(registry)
    with pytest.raises(ConfigurationError):
        metrics_for(registry, tenant_labels=True)


# -- a pod without the extras ------------------------------------------------------


def run_python(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_ctxstore_imports_neither_prometheus_nor_opentelemetry() -> None:
    """``import ctxstore`` and the store's modules import neither prometheus_client nor otel.

    (redis-py 8 imports opentelemetry itself when it is installed: what the
    store's modules import is compared with what redis.asyncio does.)
    """
    out = run_python(
        "import sys\n"
        "libs = lambda: {m for m in sys.modules if m.startswith(('prometheus_client', 'opent'))}\n"
        "import ctxstore\n"
        "print(sorted(libs()))\n"
        "import redis.asyncio\n"
        "before = libs()\n"
        "from ctxstore.store import ContextStore\n"
        "import ctxstore.metrics, ctxstore.tracing, ctxstore.summary_queue\n"
        "print(sorted(libs() - before))\n"
    )
    assert out.split("\n")[:2] == ["[]", "[]"]


def test_a_pod_without_prometheus_client_or_opentelemetry_works(
    settings: Settings, tenant: str
) -> None:
    """With neither library importable, a store appends and views, recording nothing."""
    assert settings.redis_url is not None
    code = f"""
import asyncio, sys
sys.modules["prometheus_client"] = None
sys.modules["opentelemetry"] = None
from ctxstore import ContextStore, Settings
from ctxstore.metrics import metrics_available

async def main():
    settings = Settings(redis_url={settings.redis_url!r}, key_prefix={settings.key_prefix!r})
    async with ContextStore.from_settings(settings, tenant={tenant!r}) as store:
        await store.append("s", {{"role": "user", "content": "hi"}})
        view = await store.view("s")
        assert store._observer.metrics is None
        print(len(view.messages), metrics_available())

asyncio.run(main())
"""
    assert run_python(code).split() == ["1", "False"]


# -- a worker ----------------------------------------------------------------------


async def read_result(settings: Settings, tenant: str, session: str, gen: int) -> dict[str, Any]:
    """The job's kept result, as arq stored it."""
    from arq.connections import create_pool
    from arq.jobs import Job

    from ctxstore.summary_queue import deserialize, job_id
    from workers.worker import queue_redis_settings

    pool = await create_pool(queue_redis_settings(settings), job_deserializer=deserialize)
    try:
        job = Job(
            job_id(settings, tenant, session, gen),
            pool,
            _queue_name=settings.queue_name,
            _deserializer=deserialize,
        )
        info = await job.result_info()
    finally:
        await pool.aclose()
    assert info is not None and info.success
    return dict(info.result)


@needs_arq
async def test_a_burst_worker_counts_its_job_tokens_and_samples(
    summary_settings: Settings, tenant: str
) -> None:
    """A committed job: its outcome, entries, summarizer tokens and calls, depth and lag samples."""
    from support.servers import run_burst

    pod_registry, worker_registry = CollectorRegistry(), CollectorRegistry()
    async with ContextStore.from_settings(
        summary_settings, tenant=tenant, registry=pod_registry
    ) as store:
        await store.append("s", SYSTEM)
        await append_until_due(store, "s")
        before = await store.info("s")
        fake = FakeSummarizer()
        await asyncio.wait_for(
            run_burst(
                summary_settings,
                fake,
                keep_result=60,
                registry=worker_registry,
                sample_seconds=3600,
            ),
            30,
        )
        after = await store.info("s")
        covered = [m.entry_id for m in (await store.read("s")).messages]

    result = await read_result(summary_settings, tenant, "s", before.summary_generation)
    got = await scrape(worker_registry)

    assert result["status"] == "committed"
    jobs = "ctxstore_summary_jobs_total"
    assert value(got, jobs, outcome="committed") == 1
    assert sum(v for (name, _), v in got.items() if name == jobs) == 1
    assert value(got, "ctxstore_summary_job_duration_seconds_count", outcome="committed") == 1
    assert result["entries"] == covered.index(after.summary_covers) + 1
    assert value(got, "ctxstore_summary_entries_total") == result["entries"]
    tokens = "ctxstore_summarizer_{}_tokens_total"
    assert value(got, tokens.format("input"), model="fake") == result["input_tokens"] > 0
    assert value(got, tokens.format("output"), model="fake") == result["summary_tokens"] > 0
    assert value(got, "ctxstore_summarizer_call_duration_seconds_count", model="fake") == len(
        fake.calls
    )
    assert value(got, "ctxstore_operation_duration_seconds_count", operation="summarize") == 1
    # Sampled at start (one job queued, this session's lag) and at stop (none).
    assert value(got, "ctxstore_summary_lag_tokens_count") == 1
    assert value(got, "ctxstore_summary_lag_tokens_sum") == before.tokens_unsummarized
    assert before.tokens_unsummarized > KEEP
    assert value(got, "ctxstore_summary_queue_depth") == 0
    assert value(got, "ctxstore_summary_lag_tokens_max") == 0
    # The pod counted its appends; the worker's registry holds no append.
    pod = await scrape(pod_registry)
    assert value(pod, "ctxstore_appends_total") == before.count == len(covered)
    assert value(got, "ctxstore_appends_total") == 0


@needs_arq
async def test_failed_and_retried_tries_are_counted(
    summary_settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A try that the summarizer refuses for now counts as retried; a bad request as failed."""
    from support.servers import run_burst

    import workers.jobs
    from ctxstore import SummarizerError, SummarizerUnavailableError

    registry = CollectorRegistry()
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append("s", SYSTEM)
        await append_until_due(store, "s")
    monkeypatch.setattr(workers.jobs, "retry_delay", lambda job_try, retry_after=None: 0.01)
    fake = FakeSummarizer(fail=[SummarizerUnavailableError("429"), SummarizerError("400")])
    await asyncio.wait_for(
        run_burst(summary_settings, fake, registry=registry, sample_seconds=3600), 60
    )
    got = await scrape(registry)
    jobs = "ctxstore_summary_jobs_total"
    assert value(got, jobs, outcome="retried") == 1
    assert value(got, jobs, outcome="failed") == 1
    assert value(got, jobs, outcome="committed") == 0
    errors = "ctxstore_operation_errors_total"
    assert value(got, errors, operation="summarize", error="SummarizerUnavailableError") == 1
    assert value(got, errors, operation="summarize", error="SummarizerError") == 1


def worker_env(settings: Settings) -> dict[str, str]:
    """A ``ctxstore`` command's environment on these settings."""
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
        CTXSTORE_WORKER_NAME=f"metrics-{settings.key_prefix}",
    )
    return env


def scrape_worker_until(
    settings: Settings, done: Any, deadline_s: float
) -> tuple[Samples, str, int]:
    """Run `ctxstore worker --metrics-port`, scrape until ``done(samples)``, stop it (SIGTERM).

    Returns the last scrape, the worker's output and its exit status.
    """
    port = free_port()
    proc = subprocess.Popen(
        [CTXSTORE, "worker", "--metrics-port", str(port), "--log-format", "json"],
        env=worker_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    last: Samples = {}
    try:
        deadline = time.monotonic() + deadline_s
        while not (last and done(last)):
            assert time.monotonic() < deadline, f"not there in {deadline_s} s: {sorted(ours(last))}"
            assert proc.poll() is None, "the worker exited"
            try:
                last = parse(scrape_url(f"http://127.0.0.1:{port}/metrics"))
            except (URLError, ConnectionError):
                last = {}  # not serving yet
            if not (last and done(last)):
                time.sleep(0.1)  # polling a server, with a deadline
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    return last, out, proc.returncode


@needs_arq
async def test_ctxstore_worker_serves_metrics_on_its_port(
    summary_settings: Settings, tenant: str
) -> None:
    """`ctxstore worker --metrics-port` serves /metrics: its committed job, depth and process."""
    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append("s", SYSTEM)
        await append_until_due(store, "s")
        committed = "ctxstore_summary_jobs_total"
        got, out, code = await asyncio.to_thread(
            scrape_worker_until,
            summary_settings,
            lambda s: value(s, committed, outcome="committed") >= 1,
            60,
        )
        info = await store.info("s")

    assert code == 0, out
    assert info.summary_runs == 1 and info.summary_last_outcome == "committed"
    assert value(got, committed, outcome="committed") == 1
    assert ("ctxstore_summary_queue_depth", frozenset()) in got  # sampled at start
    assert value(got, "ctxstore_summary_lag_tokens_count") >= 1
    assert any(name.startswith("process_") for name, _ in got), "the process's own metrics"
    start = next(json.loads(ln) for ln in out.splitlines() if '"event": "start"' in ln)
    assert isinstance(start["metrics_port"], int)


def test_the_metrics_port_flag_is_checked() -> None:
    """--metrics-port takes a port number (0 to 65535), refused otherwise with status 2."""
    from ctxstore.cli import main

    for bad in ("70000", "-1", "http"):
        with pytest.raises(SystemExit) as exited:
            main(["worker", "--metrics-port", bad])
        assert exited.value.code == 2


def test_every_operation_label_is_a_store_method() -> None:
    """The operation label's values are the facade's method names (append: append_many)."""
    for operation in OPERATIONS:
        name = "append_many" if operation == "append" else operation
        assert callable(getattr(ContextStore, name)), operation


def test_a_view_whose_stats_count_fewer_than_nothing_dropped_is_still_recorded() -> None:
    """A negative ``dropped`` (seen in a race of forks, rewinds and pops) never fails the view.

    prometheus_client refuses to decrease a counter; the view's metrics take the
    rest of its stats and leave the dropped count as it was.
    """
    from ctxstore.metrics import Metrics
    from ctxstore.models import ViewStats

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    stats = ViewStats(budget=400, budget_cl100k=400, tokens=300, dropped=-1)
    metrics.record_view("t", stats)
    assert registry.get_sample_value("ctxstore_view_dropped_messages_total") == 0
    assert registry.get_sample_value("ctxstore_view_tokens_count") == 1


@pytest.mark.parametrize("tenant_labels", [False, True])
def test_the_lean_instruments_read_as_prometheus_clients_own_would(tenant_labels: bool) -> None:
    """What every call records is kept as plain numbers: the same families, sample for sample."""
    from prometheus_client import Counter, Histogram, generate_latest

    lean_registry, own_registry = CollectorRegistry(), CollectorRegistry()
    metrics = Metrics(lean_registry, tenant_labels=tenant_labels)
    t = ("tenant",) if tenant_labels else ()
    own = {
        "seconds": Histogram(
            "ctxstore_operation_duration_seconds",
            metrics.operation_seconds.documentation,
            ("operation", *t),
            buckets=LATENCY_BUCKETS,
            registry=own_registry,
        ),
        "tokens": Histogram(
            "ctxstore_view_tokens",
            metrics.view_tokens.documentation,
            t,
            buckets=TOKEN_BUCKETS,
            registry=own_registry,
        ),
        "dropped": Counter(
            "ctxstore_view_dropped_messages_total",
            metrics.view_dropped.documentation,
            t,
            registry=own_registry,
        ),
    }
    labels = ("t1",) if tenant_labels else ()
    # On a bound, between bounds, past the last one, and nothing at all.
    for seconds in (0.0001, 0.0003, 0.001, 7.0, 120.0, 0.0):
        metrics.record_operation("view", "t1", seconds, None)
        own["seconds"].labels("view", *labels).observe(seconds)
    for tokens, dropped in ((100, 0), (99, 3), (2_000_000, 1), (0, 0)):
        metrics.record_view(
            "t1", ViewStats(budget=8_000, budget_cl100k=8_000, tokens=tokens, dropped=dropped)
        )
        (own["tokens"].labels(*labels) if labels else own["tokens"]).observe(tokens)
        if dropped:
            (own["dropped"].labels(*labels) if labels else own["dropped"]).inc(dropped)

    def exposed(registry: CollectorRegistry, names: tuple[str, ...]) -> list[str]:
        lines = generate_latest(registry).decode().splitlines()
        kept = [line for line in lines if any(name in line for name in names)]
        return sorted(re.sub(r"(_created(\{[^}]*\})?) \S+$", r"\1 T", line) for line in kept)

    names = ("ctxstore_operation_duration", "ctxstore_view_tokens", "ctxstore_view_dropped")
    lean = exposed(lean_registry, names)
    assert lean == exposed(own_registry, names)
    assert any('le="0.0001"' in line and line.endswith(" 2.0") for line in lean)  # 0.0 too
