"""OpenTelemetry spans, through ``opentelemetry-api`` only.

A span per store call (``ctxstore.append``, ``ctxstore.view``,
``ctxstore.replace``...), per summary enqueue (``ctxstore.enqueue``, a
producer span), per summary job try on a worker (``ctxstore.summary_job``, a
consumer span) and per summarizer call (``ctxstore.summarizer``). Each
carries the ids it is about as ``ctxstore.tenant`` and ``ctxstore.session``
(never a message, a key or a secret).

The enqueue writes its span's W3C trace context into the job (next to arq's
fields, where workers of earlier versions do not look); the worker's job
span links to it, so a trace shows which pod's append a summary came from.

Nothing is recorded unless the application installs an OpenTelemetry SDK
(``opentelemetry-sdk``) and sets a tracer provider; without
``opentelemetry-api`` installed, every function here is a no-op, and
``import ctxstore`` never imports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "ERROR_TYPE",
    "GENERATION",
    "MODEL",
    "SESSION",
    "TENANT",
    "TRACER_NAME",
    "TRY",
    "active",
    "enqueue_span",
    "job_span",
    "operation_span",
    "summarizer_span",
    "tracer",
]

TRACER_NAME: Final = "ctxstore"
"""The instrumentation scope of every span."""
TENANT: Final = "ctxstore.tenant"
"""Span attribute: the tenant id."""
SESSION: Final = "ctxstore.session"
"""Span attribute: the session id."""
GENERATION: Final = "ctxstore.summary.generation"
"""Span attribute: the summary job's generation."""
MODEL: Final = "ctxstore.summarizer.model"
"""Span attribute: the summarizer's model name."""
TRY: Final = "ctxstore.summary.try"
"""Span attribute: the summary job's try (arq's ``job_try``)."""

_UNSET: Final = object()
_NO_SPAN: Final = nullcontext()  # reusable: nullcontext holds no state
_tracer: Any = _UNSET
_trace: Any = None  # the opentelemetry.trace module, once imported


def tracer() -> Tracer | None:
    """The ctxstore tracer; ``None`` without ``opentelemetry-api``.

    A proxy until the application sets a tracer provider, so the order of
    set-up does not matter.
    """
    global _tracer, _trace
    if _tracer is _UNSET:
        try:
            from opentelemetry import trace
        except ImportError:
            _tracer = None
        else:
            from importlib.metadata import PackageNotFoundError, version

            try:
                ours = version("ctxstore")
            except PackageNotFoundError:  # pragma: no cover - run from a source tree
                ours = None
            _trace = trace
            _tracer = trace.get_tracer(TRACER_NAME, ours)
    return _tracer  # type: ignore[no-any-return]


def active() -> bool:
    """True when spans are recorded: ``opentelemetry-api`` is installed and a provider set."""
    return _recording() is not None


_provider_set = False


def _recording() -> Tracer | None:
    """The tracer, when a real tracer provider is set (else spans would record nothing).

    Asked on every store call, so it is cheap: a provider, once set, stays
    set (OpenTelemetry refuses a second one), and until then the API's own
    global is read (``get_tracer_provider()`` also reads the environment:
    a microsecond more per call).
    """
    global _provider_set
    found = tracer()
    if found is None:
        return None
    if not _provider_set:
        if getattr(_trace, "_TRACER_PROVIDER", _UNSET) is None:
            return None  # nothing set yet (the private global, where the API keeps it)
        _provider_set = not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)
    return found if _provider_set else None


ERROR_TYPE: Final = "error.type"
"""Span attribute of a call that raised: its error class (as the metrics' ``error`` label)."""


@contextmanager
def _started(
    found: Tracer,
    name: str,
    attributes: Mapping[str, str | int],
    kind: str = "INTERNAL",
    links: Sequence[Any] = (),
    context: Any = None,
) -> Iterator[Span]:
    """A span, current while the block runs; an error sets its status and ``error.type``.

    Not OpenTelemetry's own exception event: that one records the error's
    text, and ctxstore's errors name the key they are about.
    """
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from ctxstore.metrics import error_kind

    with found.start_as_current_span(
        name,
        kind=SpanKind[kind],
        attributes=dict(attributes),
        links=links,
        context=context,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as exc:
            kind_of_error = error_kind(exc)
            span.set_attribute(ERROR_TYPE, kind_of_error)
            span.set_status(Status(StatusCode.ERROR, kind_of_error))
            raise


def operation_span(operation: str, tenant: str, session: str) -> AbstractContextManager[Any]:
    """The span of one store call, ``ctxstore.<operation>``; a no-op context without an SDK."""
    found = _recording()
    if found is None:
        return _NO_SPAN
    return _started(found, f"ctxstore.{operation}", {TENANT: tenant, SESSION: session})


@contextmanager
def enqueue_span(tenant: str, session: str, generation: int) -> Iterator[dict[str, str]]:
    """The producer span of one summary enqueue; yields the trace context to put in the job.

    The dict is empty when nothing is traced (then the job carries nothing).
    """
    found = _recording()
    if found is None:
        yield {}
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    attributes: dict[str, str | int] = {TENANT: tenant, SESSION: session, GENERATION: generation}
    with _started(found, "ctxstore.enqueue", attributes, "PRODUCER"):
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        yield carrier


def job_span(
    tenant: str,
    session: str,
    generation: int,
    carrier: Mapping[str, str] | None,
    job_try: int = 1,
) -> AbstractContextManager[Any]:
    """A worker's span of one summary job try, linked to the enqueue that queued it.

    The job's span starts a trace of its own (the pod's may have ended long
    before), with a link to the enqueue's span.

    Args:
        tenant: The job's tenant.
        session: The job's session.
        generation: The job's generation.
        carrier: The trace context the job carries (``traceparent``...);
            ``None`` or malformed: no link.
        job_try: arq's try number.
    """
    found = _recording()
    if found is None:
        return _NO_SPAN
    from opentelemetry.trace import INVALID_SPAN, Link, get_current_span, set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    links = []
    if isinstance(carrier, Mapping) and carrier:
        clean = {str(k): str(v) for k, v in carrier.items()}
        linked = get_current_span(TraceContextTextMapPropagator().extract(clean))
        if linked.get_span_context().is_valid:
            links.append(Link(linked.get_span_context()))
    attributes: dict[str, str | int] = {
        TENANT: tenant,
        SESSION: session,
        GENERATION: generation,
        TRY: job_try,
    }
    root = set_span_in_context(INVALID_SPAN)
    return _started(found, "ctxstore.summary_job", attributes, "CONSUMER", links, root)


def summarizer_span(model: str) -> AbstractContextManager[Any]:
    """The span of one summarizer call (a chunk of a job), in the job's trace."""
    found = _recording()
    if found is None:
        return _NO_SPAN
    return _started(found, "ctxstore.summarizer", {MODEL: model})
