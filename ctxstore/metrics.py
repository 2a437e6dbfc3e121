"""Prometheus metrics: what pods and workers count, time and sample.

Pods record through the store's facade (``ContextStore``: one timing per
public call, its errors by kind, what each view kept and dropped); workers
add their summary jobs, the queue's depth and the summary lag they sample.
Everything is named as Prometheus asks (``ctxstore_`` prefix, base units,
``_total`` counters) and labelled from small, fixed sets: an operation name,
an error class of :mod:`ctxstore.errors` (or a built-in one), a job outcome,
a quota's name, the summarizer's model. Never a session, a message, a key or
a secret; a tenant only when ``Settings.metrics_tenant_labels`` asks for it.

``prometheus_client`` is imported when the first :class:`Metrics` is built,
never by ``import ctxstore``: pods without the ``metrics`` extra record
nothing (:func:`metrics_from_settings` answers ``None``).

Serve them with :func:`serve` (a thread of its own), or from your
application's own endpoint with ``prometheus_client.generate_latest``::

    from ctxstore.metrics import serve
    serve(9464)            # http://<pod>:9464/metrics
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from ctxstore.errors import ConfigurationError, QuotaExceededError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from prometheus_client import CollectorRegistry

    from ctxstore.models import AppendResult, SummaryOutcome, ViewStats
    from ctxstore.settings import Settings

__all__ = [
    "LATENCY_BUCKETS",
    "OPERATIONS",
    "Metrics",
    "MetricsServer",
    "Operation",
    "error_kind",
    "metrics_available",
    "metrics_for",
    "metrics_from_settings",
    "serve",
]

Operation = Literal[
    "append",
    "view",
    "replace",
    "clear",
    "pop",
    "delete",
    "summarize",
    "search",
    "checkpoint",
    "rewind",
    "fork",
]
"""A facade call that is timed (``operation`` label)."""
OPERATIONS: Final[tuple[Operation, ...]] = get_args(Operation)

LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Seconds: from a sub-millisecond Redis round trip to a summarizer's minute."""
TOKEN_BUCKETS: Final = (
    100, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 200_000, 500_000, 1_000_000,
)  # fmt: skip
"""Tokens (cl100k): a view's size, a session's summary lag."""
FILL_BUCKETS: Final = (0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)
"""A view's tokens over its budget."""

QUOTAS: Final = frozenset(
    {"message_bytes", "session_bytes", "session_tokens", "sessions", "appends_per_second"}
)
"""The ``quota`` label's values (``QuotaExceededError.quota``); anything else is ``other``."""

OTHER = "other"
"""The label value for anything outside a label's fixed set."""


def metrics_available() -> bool:
    """True when ``prometheus_client`` can be imported (the ``metrics`` extra)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


_KINDS: dict[type[BaseException], str] = {}


def _kind(cls: type[BaseException]) -> str:
    found = _KINDS.get(cls)
    if found is None:
        found = next(
            (b.__name__ for b in cls.__mro__ if b.__module__ in ("ctxstore.errors", "builtins")),
            OTHER,
        )
        if len(_KINDS) < 256:  # classes made on the fly are not remembered without end
            _KINDS[cls] = found
    return found


def error_kind(exc: BaseException) -> str:
    """The ``error`` label of an exception: its nearest class of ctxstore.errors or builtins.

    The set is fixed by the code (an application's own exception classes,
    Redis's and the summarizer SDK's are all ``other`` or their built-in
    base), so the label stays bounded, and no message text gets into it.
    """
    return _kind(type(exc))


def _go_float(value: float) -> str:
    """A bound as prometheus_client writes an ``le`` label."""
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


class _Series:
    """One labelled series of a lean instrument: its counts (or value), sum and birth."""

    __slots__ = ("counts", "created", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets  # a histogram's, per bucket (+Inf last); a counter's: none
        self.total = 0.0  # a histogram's sum, a counter's value
        self.created = time.time()


class _Lean:
    """A counter or histogram every store call records to, kept as plain numbers.

    prometheus_client takes a lock for each number it adds to (a histogram's
    ``observe`` two, after a walk over its buckets): what a view records cost
    ~8 us, 5% of a warm view. These add under their collector's one lock,
    taken once per call recorded (:class:`_LeanCollector`), and read as the
    families prometheus_client's instruments give, sample for sample.

    Args:
        name: The family's name (a counter's without ``_total``).
        documentation: Its help text.
        labelnames: Its labels; with none, its one series is there from the start.
        buckets: A histogram's upper bounds; ``None``: a counter.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(buckets) if buckets is not None else None
        self.kind = "counter" if self.bounds is None else "histogram"
        self._width = len(self.bounds) + 1 if self.bounds is not None else 0
        # The bounds as the `le` label writes them, +Inf last.
        self._le = tuple(_go_float(b) for b in (*(self.bounds or ()), math.inf))
        self.series: dict[tuple[str, ...], _Series] = {}
        if not self.labelnames:
            self.series[()] = _Series(self._width)

    def add(self, labels: tuple[str, ...], value: float) -> None:
        """Count ``value`` (a counter's increment, a histogram's observation); hold the lock."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Series(self._width)
        if self.bounds is not None:
            series.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        series.total += value

    def family(self) -> Any:
        """Its family, as prometheus_client's own instrument would give it; hold the lock."""
        from prometheus_client.metrics_core import Metric

        family = Metric(self.name, self.documentation, self.kind)
        for values, series in self.series.items():
            labels = dict(zip(self.labelnames, values, strict=True))
            if self.bounds is None:
                family.add_sample(f"{self.name}_total", labels, series.total)
            else:
                seen = 0
                for le, count in zip(self._le, series.counts, strict=True):
                    seen += count
                    family.add_sample(f"{self.name}_bucket", {**labels, "le": le}, seen)
                family.add_sample(f"{self.name}_count", labels, seen)
                family.add_sample(f"{self.name}_sum", labels, series.total)
            family.add_sample(f"{self.name}_created", labels, series.created)
        return family


class _LeanCollector:
    """The lean instruments of one :class:`Metrics`, and the one lock they add under."""

    def __init__(self, instruments: Sequence[_Lean]) -> None:
        self.lock = threading.Lock()
        self.instruments = tuple(instruments)

    def collect(self) -> Iterator[Any]:
        with self.lock:
            families = [instrument.family() for instrument in self.instruments]
        yield from families

    def describe(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric

        for instrument in self.instruments:
            yield Metric(instrument.name, instrument.documentation, instrument.kind)


class Metrics:
    """The instruments on one registry; build it with :func:`metrics_for`.

    Each ``record_*`` method is what one event adds. The tenant argument is
    dropped unless ``tenant_labels`` is on.

    Args:
        registry: Where the instruments are registered.
        tenant_labels: Add a ``tenant`` label (an operator's opt-in: one
            series per tenant).
    """

    def __init__(self, registry: CollectorRegistry, *, tenant_labels: bool = False) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.registry = registry
        self.tenant_labels = tenant_labels
        t: tuple[str, ...] = ("tenant",) if tenant_labels else ()
        kw: dict[str, Any] = {"registry": registry}
        # What every store call records: lean instruments (see _Lean).
        self.operation_seconds = _Lean(
            "ctxstore_operation_duration_seconds",
            "Seconds a store call took (its _count: calls, failed ones included).",
            ("operation", *t),
            LATENCY_BUCKETS,
        )
        self.operation_errors = Counter(
            "ctxstore_operation_errors_total",
            "Store calls that raised, by operation and error class.",
            ("operation", "error", *t),
            **kw,
        )
        self.appends = _Lean(
            "ctxstore_appends", "Messages appended (written; not retried duplicates).", t
        )
        self.duplicates = _Lean(
            "ctxstore_append_duplicates",
            "Appends answered from their idempotency key (nothing written).",
            t,
        )
        self.quota_refusals = Counter(
            "ctxstore_quota_refusals_total",
            "Writes refused by a tenant quota, by quota.",
            ("quota", *t),
            **kw,
        )
        self.view_tokens = _Lean(
            "ctxstore_view_tokens", "Tokens (cl100k) a view sent.", t, TOKEN_BUCKETS
        )
        self.view_fill = _Lean(
            "ctxstore_view_budget_fill_ratio",
            "A view's tokens over its budget (cl100k).",
            t,
            FILL_BUCKETS,
        )
        self.view_dropped = _Lean(
            "ctxstore_view_dropped_messages", "History messages views left out.", t
        )
        self.view_offloaded = _Lean(
            "ctxstore_view_offloaded_messages", "Tool results views sent as a preview.", t
        )
        self.view_repairs = _Lean(
            "ctxstore_view_repairs", "Tool-pair repairs views made (orphans).", t
        )
        self.view_summary = _Lean(
            "ctxstore_view_summary_used", "Views that sent a cached summary.", t
        )
        self.view_over_budget = _Lean(
            "ctxstore_view_over_budget",
            "Views whose system and pinned messages alone exceeded the budget.",
            t,
        )
        self._lean = _LeanCollector([v for v in vars(self).values() if isinstance(v, _Lean)])
        registry.register(self._lean)
        self.jobs = Counter(
            "ctxstore_summary_jobs_total",
            "Summary job tries, by outcome (committed, idle, stale, lease_lost, failed, retried).",
            ("outcome", *t),
            **kw,
        )
        self.job_seconds = Histogram(
            "ctxstore_summary_job_duration_seconds",
            "Seconds a summary job try took, by outcome.",
            ("outcome",),
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.job_entries = Counter(
            "ctxstore_summary_entries_total",
            "Messages newly covered by committed summaries.",
            t,
            **kw,
        )
        self.summarizer_input = Counter(
            "ctxstore_summarizer_input_tokens_total",
            "Tokens sent to the summarizer (cl100k), by model.",
            ("model", *t),
            **kw,
        )
        self.summarizer_output = Counter(
            "ctxstore_summarizer_output_tokens_total",
            "Tokens of the summaries written (cl100k), by model.",
            ("model", *t),
            **kw,
        )
        self.summarizer_seconds = Histogram(
            "ctxstore_summarizer_call_duration_seconds",
            "Seconds one summarizer call took, by model.",
            ("model",),
            buckets=LATENCY_BUCKETS,
            **kw,
        )
        self.queue_depth = Gauge(
            "ctxstore_summary_queue_depth",
            "Summary jobs queued, deferred or running (sampled by each worker).",
            **kw,
        )
        self.lag = Histogram(
            "ctxstore_summary_lag_tokens",
            "Tokens past the summary of each session sampled from the queue's oldest jobs.",
            buckets=TOKEN_BUCKETS,
            **kw,
        )
        self.lag_max = Gauge(
            "ctxstore_summary_lag_tokens_max",
            "The largest summary lag (tokens) in the worker's last sample.",
            t,
            **kw,
        )
        self._lock = threading.Lock()

    def _t(self, tenant: str) -> tuple[str, ...]:
        return (tenant,) if self.tenant_labels else ()

    def record_operation(
        self, operation: Operation, tenant: str, seconds: float, error: BaseException | None
    ) -> None:
        """One store call: its time, and its error's kind if it raised."""
        t = self._t(tenant)
        with self._lean.lock:
            self.operation_seconds.add((operation, *t), seconds)
        if error is not None:
            self.operation_errors.labels(operation, error_kind(error), *t).inc()
            if isinstance(error, QuotaExceededError):
                quota = error.quota if error.quota in QUOTAS else OTHER
                self.quota_refusals.labels(quota, *t).inc()

    def record_appends(self, tenant: str, results: Sequence[AppendResult]) -> None:
        """What an append call wrote."""
        duplicates = sum(1 for r in results if r.duplicate)
        t = self._t(tenant)
        with self._lean.lock:
            if len(results) > duplicates:
                self.appends.add(t, len(results) - duplicates)
            if duplicates:
                self.duplicates.add(t, duplicates)

    def record_view(self, tenant: str, stats: ViewStats) -> None:
        """What a view kept, dropped, offloaded and repaired."""
        t = self._t(tenant)
        with self._lean.lock:
            self.view_tokens.add(t, stats.tokens)
            if stats.budget_cl100k > 0:
                self.view_fill.add(t, stats.tokens / stats.budget_cl100k)
            if stats.dropped > 0:  # a counter counts no less than 0, and a view must not fail
                self.view_dropped.add(t, stats.dropped)
            if stats.offloaded:
                self.view_offloaded.add(t, len(stats.offloaded))
            if stats.repairs:
                self.view_repairs.add(t, len(stats.repairs))
            if stats.summary_used:
                self.view_summary.add(t, 1)
            if stats.over_budget:
                self.view_over_budget.add(t, 1)

    def record_job(
        self,
        tenant: str,
        outcome: str,
        seconds: float,
        done: SummaryOutcome | None = None,
        model: str = "",
    ) -> None:
        """One summary job try: its outcome (a ``SummaryStatus`` value or ``retried``)."""
        t = self._t(tenant)
        self.jobs.labels(outcome, *t).inc()
        self.job_seconds.labels(outcome).observe(seconds)
        if done is None:
            return
        if done.entries:
            (self.job_entries.labels(*t) if t else self.job_entries).inc(done.entries)
        if done.input_tokens or done.summary_tokens:
            self.summarizer_input.labels(model, *t).inc(done.input_tokens)
            self.summarizer_output.labels(model, *t).inc(done.summary_tokens)

    def record_summarizer_call(self, model: str, seconds: float) -> None:
        """One call to the summarizer (a chunk of a job)."""
        self.summarizer_seconds.labels(model).observe(seconds)

    def record_sample(self, depth: int, lags: Sequence[tuple[str, int]]) -> None:
        """A worker's sample: the queue's depth, and ``(tenant, lag)`` of sessions it looked at."""
        self.queue_depth.set(depth)
        for _, lag in lags:
            self.lag.observe(lag)
        with self._lock:  # clear then set: a tenant that caught up loses its series
            if self.tenant_labels:
                self.lag_max.clear()
                highest: dict[str, int] = {}
                for tenant, lag in lags:
                    highest[tenant] = max(lag, highest.get(tenant, 0))
                for tenant, lag in highest.items():
                    self.lag_max.labels(tenant).set(lag)
            else:
                self.lag_max.set(max((lag for _, lag in lags), default=0))


_BY_REGISTRY: dict[int, tuple[Any, Metrics]] = {}
_BY_REGISTRY_LOCK = threading.Lock()


def metrics_for(
    registry: CollectorRegistry | None = None, *, tenant_labels: bool = False
) -> Metrics:
    """The one :class:`Metrics` of ``registry`` (``prometheus_client.REGISTRY`` by default).

    A registry takes each metric name once, so every store and worker of a
    process on the same registry shares these instruments.

    Raises:
        ModuleNotFoundError: ``prometheus_client`` is not installed.
        ConfigurationError: The registry's metrics were built with the other
            ``tenant_labels``.
    """
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    with _BY_REGISTRY_LOCK:
        found = _BY_REGISTRY.get(id(registry))
        if found is None or found[0] is not registry:
            found = (registry, Metrics(registry, tenant_labels=tenant_labels))
            _BY_REGISTRY[id(registry)] = found
    metrics = found[1]
    if metrics.tenant_labels != tenant_labels:
        raise ConfigurationError(
            "this registry's ctxstore metrics were built with metrics_tenant_labels="
            f"{metrics.tenant_labels}; one process uses one value"
        )
    return metrics


def metrics_from_settings(
    settings: Settings, registry: CollectorRegistry | None = None
) -> Metrics | None:
    """The metrics a store or worker records to: ``None`` when off or not installed.

    On when ``settings.metrics`` is (the default) and ``prometheus_client``
    is importable.
    """
    if not settings.metrics or (registry is None and not metrics_available()):
        return None
    return metrics_for(registry, tenant_labels=settings.metrics_tenant_labels)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running ``/metrics`` server (:func:`serve`).

    Attributes:
        port: The port it listens on (the one asked for, or the one picked for 0).
    """

    port: int
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve(
    port: int, addr: str = "0.0.0.0", registry: CollectorRegistry | None = None
) -> MetricsServer:
    """Serve ``registry``'s metrics at ``http://addr:port/metrics``, from a daemon thread.

    One call per process (a pod's or a worker's). ``port=0`` picks a free one.

    Raises:
        ConfigurationError: ``prometheus_client`` is not installed, or the
            port cannot be bound.
    """
    try:
        from prometheus_client import REGISTRY, start_http_server
    except ImportError as exc:
        raise ConfigurationError(
            "serving metrics needs prometheus_client: pip install '.[metrics]' in a checkout "
            "of ctxstore"
        ) from exc
    try:
        server, thread = start_http_server(
            port, addr=addr, registry=registry if registry is not None else REGISTRY
        )
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
    return MetricsServer(int(server.server_address[1]), server, thread)
