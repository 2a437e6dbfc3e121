"""The facade's instruments: each public call timed, counted and traced in one place.

:func:`observed` decorates a ``ContextStore`` method: it opens the call's
span (:mod:`ctxstore.tracing`), times it, counts its error by kind, and
hands the result to a recorder (a view's stats, an append's results) of
:mod:`ctxstore.metrics`. A store with metrics off and no tracer provider set
pays one attribute read and one check per call.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from ctxstore import tracing

if TYPE_CHECKING:
    from ctxstore.metrics import Metrics, Operation
    from ctxstore.models import AppendResult, RequestView
    from ctxstore.summarizers import Summarizer

__all__ = ["Observer", "observed", "record_appends", "record_view"]

P = ParamSpec("P")
R = TypeVar("R")


class Observer:
    """What one store records to: its metrics (or ``None``) and its tenant.

    Args:
        metrics: The instruments; ``None`` when metrics are off.
        tenant: The store's tenant (a label only when the operator opted in).
    """

    __slots__ = ("metrics", "tenant")

    def __init__(self, metrics: Metrics | None, tenant: str) -> None:
        self.metrics = metrics
        self.tenant = tenant

    def for_tenant(self, tenant: str) -> Observer:
        """The same instruments, for another tenant's store."""
        return Observer(self.metrics, tenant)

    def summarizer(self, summarizer: Summarizer) -> Summarizer:
        """``summarizer``, each of its calls timed and traced (itself when nothing records)."""
        if self.metrics is None and not tracing.active():
            return summarizer
        if hasattr(summarizer, "summarize_levels"):
            return _ObservedLevels(summarizer, self.metrics)
        return _Observed(summarizer, self.metrics)


class _HasObserver(Protocol):
    _observer: Observer


S = TypeVar("S", bound=_HasObserver)
Recorder = Callable[["Metrics", str, Any], None]


Method = Callable[Concatenate[S, P], Coroutine[Any, Any, R]]


def observed(
    operation: Operation, record: Recorder | None = None
) -> Callable[[Method[S, P, R]], Method[S, P, R]]:
    """Time, count and trace a store method whose first argument is the session id.

    Args:
        operation: The ``operation`` label and the span's name.
        record: Called with the metrics, the tenant and the result when the
            call returns (not when it raises).
    """

    def wrap(method: Method[S, P, R]) -> Method[S, P, R]:
        @functools.wraps(method)
        async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            observer = self._observer
            metrics = observer.metrics
            session = args[0] if args else kwargs.get("session")
            with tracing.operation_span(operation, observer.tenant, str(session)):
                if metrics is None:
                    return await method(self, *args, **kwargs)
                started = time.perf_counter()
                try:
                    result = await method(self, *args, **kwargs)
                except Exception as exc:
                    metrics.record_operation(
                        operation, observer.tenant, time.perf_counter() - started, exc
                    )
                    raise
                metrics.record_operation(
                    operation, observer.tenant, time.perf_counter() - started, None
                )
                if record is not None:
                    record(metrics, observer.tenant, result)
                return result

        return run

    return wrap


def record_appends(metrics: Metrics, tenant: str, results: Sequence[AppendResult]) -> None:
    """An append call's recorder."""
    metrics.record_appends(tenant, results)


def record_view(metrics: Metrics, tenant: str, view: RequestView) -> None:
    """A view's recorder."""
    metrics.record_view(tenant, view.stats)


class _Observed:
    """A summarizer whose calls are timed and traced (``summarize`` only)."""

    def __init__(self, inner: Any, metrics: Metrics | None) -> None:
        self.inner = inner
        self.name: str = inner.name
        self._metrics = metrics

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Any:
        with tracing.summarizer_span(self.name):
            started = time.perf_counter()
            try:
                return await method(*args, **kw)
            finally:
                if self._metrics is not None:
                    self._metrics.record_summarizer_call(self.name, time.perf_counter() - started)

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """The inner summarizer's ``summarize``."""
        return str(
            await self._call(self.inner.summarize, previous, messages, max_tokens=max_tokens)
        )


class _ObservedLevels(_Observed):
    """A two-level summarizer whose calls are timed and traced."""

    async def summarize_levels(self, *args: Any, **kwargs: Any) -> Any:
        """The inner summarizer's ``summarize_levels``."""
        return await self._call(self.inner.summarize_levels, *args, **kwargs)
