"""OpenTelemetry spans: one per store call, the enqueue's context in the job, the worker's link.

An SDK tracer provider (opentelemetry-sdk) is set once for the process, as
an application would; its exporter keeps spans only while a test asks
(``spans``), so the rest of the suite is not recorded.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from redis.asyncio import Redis
from support.helpers import SYSTEM, append_until_due, oa_result, turn, user

from ctxstore import ContextStore, QuotaExceededError, Settings, tracing
from ctxstore.summary_queue import (
    TRACE_FIELD,
    SummaryQueue,
    deserialize,
    job_id,
    job_trace_context,
)
from ctxstore.testing import FakeSummarizer

needs_arq = pytest.mark.skipif(
    importlib.util.find_spec("arq") is None, reason="the summary worker needs ctxstore[worker]"
)


class ArmedExporter(InMemorySpanExporter):
    """Keeps spans only while armed."""

    armed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.armed:
            return SpanExportResult.SUCCESS
        return super().export(spans)


EXPORTER = ArmedExporter()


def install_provider() -> None:
    """Set the SDK provider once (OpenTelemetry takes one per process), exporting to EXPORTER."""
    current = trace.get_tracer_provider()
    if getattr(current, "_ctxstore_test", False):
        return
    if isinstance(current, TracerProvider):
        current.add_span_processor(SimpleSpanProcessor(EXPORTER))
    else:
        current = TracerProvider()
        current.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(current)
    current._ctxstore_test = True  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished during the test."""
    install_provider()
    EXPORTER.clear()
    EXPORTER.armed = True
    try:
        yield EXPORTER
    finally:
        EXPORTER.armed = False
        EXPORTER.clear()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent of a span."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def attribute_values(exporter: InMemorySpanExporter) -> list[str]:
    """Every attribute value of every span and of its events, as text."""
    found = []
    for span in exporter.get_finished_spans():
        found += [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            found += [str(v) for v in (event.attributes or {}).values()]
    return found


async def test_each_store_call_is_a_span_with_tenant_and_session(
    store: ContextStore, tenant: str, spans: InMemorySpanExporter
) -> None:
    """append, view, replace, clear, pop and delete each make one span naming tenant and session."""
    await store.append("s", user("the secret plan"))
    await store.view("s")
    await store.replace("s", [user("a"), user("b")])
    await store.pop("s")
    await store.clear("s")
    await store.delete("s")

    names = [s.name for s in spans.get_finished_spans()]
    assert names == [
        "ctxstore.append",
        "ctxstore.view",
        "ctxstore.replace",
        "ctxstore.pop",
        "ctxstore.clear",
        "ctxstore.delete",
    ]
    for span in spans.get_finished_spans():
        assert dict(span.attributes or {}) == {tracing.TENANT: tenant, tracing.SESSION: "s"}
        assert span.kind == SpanKind.INTERNAL
        assert span.status.status_code == StatusCode.UNSET
    assert not any("secret" in v for v in attribute_values(spans))


async def test_a_failed_call_marks_its_span_with_the_error_class_only(
    settings: Settings, tenant: str, spans: InMemorySpanExporter
) -> None:
    """A refused append: an error status and error.type, no message text and no key in the span."""
    small = settings.model_copy(update={"session_tokens": 40})
    async with ContextStore.from_settings(small, tenant=tenant) as store:
        await store.append("s", user("short"))
        with pytest.raises(QuotaExceededError) as refused:
            await store.append("s", turn(1))
        keys = store.keys("s")
    assert refused.value.key is not None  # the error names a key: the span must not
    (failed,) = [s for s in named(spans, "ctxstore.append") if s.status.status_code.name == "ERROR"]
    assert failed.status.description == "QuotaExceededError"
    assert (failed.attributes or {})[tracing.ERROR_TYPE] == "QuotaExceededError"
    assert not failed.events
    for text in attribute_values(spans):
        assert keys.meta not in text and "the quick brown fox" not in text


async def test_no_trace_context_in_a_job_when_nothing_is_traced(
    summary_settings: Settings, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a recording tracer, a job is exactly arq's five fields, as before."""
    monkeypatch.setattr(tracing, "_recording", lambda: None)
    queue = await SummaryQueue.connect(summary_settings)
    try:
        assert await queue.enqueue(tenant, "s", 7)
        raw = await job_payload(summary_settings, tenant, "s", 7)
    finally:
        await queue.aclose()
    assert set(json.loads(raw)) == {"t", "f", "a", "k", "et"}
    assert deserialize(raw)["k"] == {}
    assert job_trace_context() is None


async def job_payload(settings: Settings, tenant: str, session: str, generation: int) -> bytes:
    """The bytes of a queued job's key, as a worker reads them."""
    client = Redis.from_url(settings.queue_url or settings.store_url())
    try:
        raw = await client.get(f"arq:job:{job_id(settings, tenant, session, generation)}")
    finally:
        await client.aclose()
    assert raw is not None
    return bytes(raw)


@needs_arq
async def test_an_earlier_worker_runs_a_traced_job_as_before(
    summary_settings: Settings, tenant: str, spans: InMemorySpanExporter
) -> None:
    """Arq reads f, a, k of a traced job: its trace context is beside them, not an argument."""
    from arq.jobs import deserialize_job_raw

    queue = await SummaryQueue.connect(summary_settings)
    try:
        assert await queue.enqueue(tenant, "s", 7)
        raw = await job_payload(summary_settings, tenant, "s", 7)
    finally:
        await queue.aclose()
    (enqueue,) = named(spans, "ctxstore.enqueue")

    # An earlier worker's deserializer was plain JSON; this version's reads the same job.
    for deserializer in (json.loads, deserialize):
        function, args, kwargs, _, _ = deserialize_job_raw(raw, deserializer=deserializer)
        assert (function, args, kwargs) == ("summarize_session", [tenant, "s", 7], {})
    # ...and keeps the context for the job it starts.
    assert job_trace_context() == {"traceparent": traceparent(enqueue)}
    assert json.loads(raw)[TRACE_FIELD] == {"traceparent": traceparent(enqueue)}


@needs_arq
async def test_the_worker_job_span_links_to_the_pods_enqueue(
    summary_settings: Settings, tenant: str, spans: InMemorySpanExporter
) -> None:
    """Pod: append, enqueue (producer); worker: job (consumer, linked), summarize, summarizer."""
    from support.servers import run_burst

    async with ContextStore.from_settings(summary_settings, tenant=tenant) as store:
        await store.append("s", SYSTEM)
        await append_until_due(store, "s")
        generation = (await store.info("s")).summary_generation
        (enqueue,) = named(spans, "ctxstore.enqueue")
        payload = json.loads(await job_payload(summary_settings, tenant, "s", generation))
        fake = FakeSummarizer()
        await asyncio.wait_for(run_burst(summary_settings, fake), 30)

    # The pod's side: the enqueue is a producer span inside the append that made it due.
    appends = {s.context.span_id: s for s in named(spans, "ctxstore.append") if s.context}
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.parent is not None and enqueue.parent.span_id in appends
    assert dict(enqueue.attributes or {}) == {
        tracing.TENANT: tenant,
        tracing.SESSION: "s",
        tracing.GENERATION: generation,
    }
    assert payload[TRACE_FIELD] == {"traceparent": traceparent(enqueue)}

    # The worker's side: a trace of its own, linked to the enqueue.
    (job,) = named(spans, "ctxstore.summary_job")
    assert job.kind == SpanKind.CONSUMER and job.parent is None
    assert job.context is not None and enqueue.context is not None
    assert job.context.trace_id != enqueue.context.trace_id
    (link,) = job.links
    assert (link.context.trace_id, link.context.span_id) == (
        enqueue.context.trace_id,
        enqueue.context.span_id,
    )
    assert dict(job.attributes or {}) == {
        tracing.TENANT: tenant,
        tracing.SESSION: "s",
        tracing.GENERATION: generation,
        tracing.TRY: 1,
    }
    (summarize,) = named(spans, "ctxstore.summarize")
    assert summarize.parent is not None and summarize.parent.span_id == job.context.span_id
    calls = named(spans, "ctxstore.summarizer")
    assert len(calls) == len(fake.calls) >= 1
    for call in calls:
        assert call.parent is not None and summarize.context is not None
        assert call.parent.span_id == summarize.context.span_id
        assert dict(call.attributes or {}) == {tracing.MODEL: "fake"}
    assert not any("quick brown fox" in v for v in attribute_values(spans))


@needs_arq
async def test_a_job_with_a_malformed_trace_context_runs_unlinked(
    summary_settings: Settings, tenant: str, spans: InMemorySpanExporter
) -> None:
    """A job whose trace context is garbage still runs; its span just has no link."""
    import workers.jobs

    ctx: dict[str, Any] = {"job_try": 1}
    seen: list[tuple[str, str, int]] = []

    async def fake_run(
        ctx: dict[str, Any], tenant: str, session: str, generation: int
    ) -> dict[str, Any]:
        seen.append((tenant, session, generation))
        return {}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workers.jobs, "_summarize", fake_run)
        for bad in ({"traceparent": "00-zz-yy-01"}, {"traceparent": 7}, "text", None):
            job = {"t": 1, "f": "summarize_session", "a": [tenant, "s", 1], "k": {}, "et": 0}
            deserialize(json.dumps({**job, TRACE_FIELD: bad}).encode())
            await workers.jobs.summarize_session(ctx, tenant, "s", 1)
    assert seen == [(tenant, "s", 1)] * 4
    jobs = named(spans, "ctxstore.summary_job")
    assert len(jobs) == 4 and not any(job.links for job in jobs)


async def test_an_orphan_repair_view_span_holds_ids_only(
    store: ContextStore, tenant: str, spans: InMemorySpanExporter
) -> None:
    """A view that repairs an orphan result: its span carries the ids, not the call id or text."""
    await store.append_many("s", [user("q"), oa_result("call_SECRET", "result SECRET")])
    view = await store.view("s")
    assert view.stats.repairs
    (span,) = named(spans, "ctxstore.view")
    assert dict(span.attributes or {}) == {tracing.TENANT: tenant, tracing.SESSION: "s"}
    assert not any("SECRET" in v for v in attribute_values(spans))
