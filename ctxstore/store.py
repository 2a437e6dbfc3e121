"""The store: one tenant's sessions, each a Redis Stream of messages.

:class:`ContextStore` is a facade: it is built on its tenant's parts
(:mod:`ctxstore._parts.assembly`), and each method calls the part that owns
the concept (as ``limits``' storage classes delegate to small parts).

- writes (:mod:`ctxstore._parts.writes`): appends, lock-free and idempotent;
  edits (:mod:`ctxstore._parts.edits`): replace and clear under the session's
  fenced lease, pop, pin, TTL and delete;
- reads (:mod:`ctxstore._parts.reads`): history pages, entries, counters; the
  request view (:mod:`ctxstore._parts.anchor`) over its one-round-trip snapshot
  (:mod:`ctxstore._parts.snapshot`), planned by :mod:`ctxstore._plan`;
- history moves: checkpoints, rewinds and branches, forks, export and import,
  search (:mod:`ctxstore._parts`);
- summaries (:mod:`ctxstore._parts.summary`): the worker's job and its request;
- the tenant (:mod:`ctxstore._tenant`): its index, quotas, learned ratios, forgetting;
- the queue hand-off (:mod:`ctxstore.summary_queue`).

A store is bound to one tenant: every key it formats carries that tenant,
and ids are validated before any key is formatted.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import Codec
from ctxstore._layout.memo import Memo
from ctxstore._parts.assembly import Parts
from ctxstore._parts.observe import Observer, observed, record_appends, record_view
from ctxstore._parts.scope import Scope
from ctxstore._plan.warm import WarmViews
from ctxstore._redis.client import make_client
from ctxstore._redis.connection import Connection
from ctxstore._tenant.forget import forget_tenant
from ctxstore.encryption import Keyring
from ctxstore.lease import Clock, Lease, LeaseKind, take_lease
from ctxstore.metrics import metrics_from_settings
from ctxstore.models import (
    AppendResult,
    Branch,
    Checkpoint,
    ForkResult,
    HistoryPage,
    ImportResult,
    RequestView,
    RewindResult,
    SearchHit,
    SessionInfo,
    SessionSummary,
    StoredMessage,
    SummaryOutcome,
    TenantLimits,
    WriteResult,
)
from ctxstore.settings import Settings
from ctxstore.summary_queue import Handoff, SummaryDue
from ctxstore.tokens import TiktokenCounter, TokenCounter, checked

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ctxstore.summarizers import Summarizer

__all__ = ["ContextStore", "SummaryDue"]

TENANT_STORES = 1_000
"""The most tenants' stores a store and those it gave (:meth:`ContextStore.for_tenant`) keep:
the least recently asked for goes first, and is built again when asked for again."""


class ContextStore(Parts):
    """One tenant's context store.

    Build one with :meth:`from_settings` or :meth:`from_url`, use it as an
    async context manager (or call :meth:`aclose`), and share it between the
    tasks of a process: it holds a connection pool. Any event loop of any
    thread may call it (``Runner.run_sync``, ``asyncio.run`` in a thread,
    several loops at once): each loop gets connections of its own.

    The attributes ``tenant``, ``settings``, ``keyring``, ``counter`` and
    ``clock`` are the arguments it was built with (read-only).

    Args:
        client: A redis-py asyncio client (standalone or cluster). Another event
            loop gets a copy of a standalone one; a cluster client you build serves
            one loop at a time (``from_settings`` builds one for each loop).
        tenant: The tenant every call works on; it cannot name another's keys.
        settings: Limits, timeouts and defaults.
        counter: Counts tokens at append; cl100k (tiktoken) by default.
        clock: The time leases use; the Redis server's clock by default.
        on_summary_due: Called when an append makes a summary due (the
            worker queue's enqueue); the settings' queue by default.
        keyring: Seals message content at rest; from the settings'
            ``encryption_keys`` by default (none: stored in clear).
        registry: The Prometheus registry its metrics go to
            (``prometheus_client.REGISTRY`` by default); none are recorded
            when ``settings.metrics`` is off or prometheus_client is missing
            (:mod:`ctxstore.metrics`).
    """

    def __init__(
        self,
        client: Any,
        *,
        tenant: str,
        settings: Settings | None = None,
        counter: TokenCounter | None = None,
        clock: Clock | None = None,
        on_summary_due: SummaryDue | None = None,
        keyring: Keyring | None = None,
        registry: CollectorRegistry | None = None,
        _connection: Connection | None = None,
        _handoff: Handoff | None = None,
        _observer: Observer | None = None,
        _warm: WarmViews | None = None,
        _tenants: Memo[str, ContextStore] | None = None,
    ) -> None:
        self.settings = settings = settings or Settings()
        self.tenant = tenant = _keys.validate_id(tenant, "tenant")
        self.keyring = keyring if keyring is not None else Keyring.from_settings(settings)
        self.counter = counter or TiktokenCounter()
        self.clock = clock
        self._connection = (_connection or Connection(client, settings)).for_tenant(tenant)
        codec = Codec(tenant, self.keyring)
        scope = Scope(tenant, settings, self._connection, codec, checked(self.counter), clock)
        handoff = _handoff or Handoff(settings, on_summary_due, scope.wall_ms)
        warm = _warm if _warm is not None else WarmViews(settings.view_cache_bytes)
        super().__init__(scope, handoff, warm)  # the tenant's parts (ctxstore._parts.assembly)
        self._observer = _observer or Observer(metrics_from_settings(settings, registry), tenant)
        if _tenants is None:
            _tenants = Memo(TENANT_STORES)
            _tenants.put(tenant, self)
        self._tenants = _tenants

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, tenant: str | None = None, **kwargs: Any
    ) -> ContextStore:
        """A store on the settings' Redis (the embedded one without a URL); no I/O yet.

        ``tenant`` defaults to ``settings.tenant``; ``kwargs`` as the constructor's.
        """
        settings = settings or Settings()
        tenant = settings.tenant if tenant is None else tenant
        url = settings.store_url()
        client = make_client(url, settings)
        if "_connection" not in kwargs:  # the embedded Redis it started, when it has no URL
            kwargs["_connection"] = Connection(
                client,
                settings,
                embedded=settings.redis_url is None,
                copy=lambda: make_client(url, settings),  # each other event loop's client
            )
        return cls(client, tenant=tenant, settings=settings, **kwargs)

    @classmethod
    def from_url(cls, url: str, tenant: str, **kwargs: Any) -> ContextStore:
        """A store on the Redis at ``url``; other settings from the environment."""
        settings = kwargs.pop("settings", None) or Settings()
        return cls.from_settings(
            settings.model_copy(update={"redis_url": url}), tenant=tenant, **kwargs
        )

    def for_tenant(self, tenant: str) -> ContextStore:
        """Another tenant's store on this one's connection and queue (closed with it).

        Asked for the same tenant again (of this store or of any it gave), it
        is the same store, while it is among the last :data:`TENANT_STORES`
        asked for: an application may call this per request, and what a store
        learns (the tenant's limits, the sessions whose appends need the full
        form, how far back its views read) is not lost between requests.
        """
        store = self._tenants.get(tenant) if type(tenant) is str else None
        if store is not None:
            return store
        store = ContextStore(
            self._connection.client,
            tenant=tenant,
            settings=self.settings,
            counter=self.counter,
            clock=self.clock,
            keyring=self.keyring,
            _connection=self._connection,
            _handoff=self._handoff,
            _observer=self._observer.for_tenant(tenant),
            _warm=self._viewer.warm,
            _tenants=self._tenants,
        )
        self._tenants.put(store.tenant, store)  # validated: an exact str
        return store

    async def aclose(self) -> None:
        """Close the connections, every event loop's (and the summary queue, if one was opened)."""
        await self._handoff.aclose()
        await self._connection.aclose()

    async def __aenter__(self) -> ContextStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def keys(self, session: str) -> _keys.SessionKeys:
        """The keys of one of this tenant's sessions (raises InvalidIdError for a bad id)."""
        return self._scope.keys(session)

    # -- writes ----------------------------------------------------------------

    async def append(
        self,
        session: str,
        message: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        expected_seq: int | None = None,
        pinned: bool = False,
    ) -> AppendResult:
        """Append one message, in one round trip, without a lock.

        Args:
            session: The session id.
            message: The message, a dict (see :class:`~ctxstore.models.Message`).
            idempotency_key: A retry with the same key writes nothing and answers
                the original entry (random by default; SDK retries reuse it).
            expected_seq: Append only if the session is at this sequence number.
            pinned: Send this message in every view, whatever the budget.

        Raises:
            InvalidMessageError, ConflictError, QuotaExceededError: Nothing is written.
        """
        keys = None if idempotency_key is None else [idempotency_key]
        results = await self.append_many(
            session, [message], idempotency_keys=keys, expected_seq=expected_seq, pinned=pinned
        )
        return results[0]

    @observed("append", record_appends)
    async def append_many(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        *,
        idempotency_keys: Sequence[str] | None = None,
        expected_seq: int | None = None,
        pinned: bool = False,
    ) -> list[AppendResult]:
        """Append several messages at once: all of them, in order, or none (as :meth:`append`)."""
        return await self._writer.append(
            session,
            messages,
            idempotency_keys=idempotency_keys,
            expected_seq=expected_seq,
            pinned=pinned,
        )

    async def lease(
        self,
        session: str,
        *,
        kind: LeaseKind = "write",
        ttl_s: float | None = None,
        wait_s: float | None = None,
    ) -> Lease:
        """Take the session's lease (``async with``); a ``write`` lease takes a worker's at once.

        Raises:
            LeaseHeldError: Another holder kept it for longer than ``wait_s``.
        """
        return await take_lease(self._scope, session, kind=kind, ttl_s=ttl_s, wait_s=wait_s)

    @observed("replace")
    async def replace(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        *,
        expected_seq: int | None = None,
        lease: Lease | None = None,
    ) -> WriteResult:
        """Replace the whole history (session resume) under the lease; the epoch is bumped.

        Appends Redis orders before it belong to the history it supersedes
        (``superseded`` counts them); ``expected_seq`` refuses it if anything
        was written since you read. ``lease``: one already held (consumed).

        Raises:
            InvalidMessageError, ConflictError: Nothing is written.
            LeaseHeldError, LeaseLostError: The lease was held, or lost before the write.
        """
        return await self._editor.rewrite(session, messages, expected_seq=expected_seq, lease=lease)

    @observed("clear")
    async def clear(
        self, session: str, *, expected_seq: int | None = None, lease: Lease | None = None
    ) -> WriteResult:
        """Drop every message (a reset), under the lease; the epoch is bumped."""
        return await self._editor.rewrite(session, [], expected_seq=expected_seq, lease=lease)

    @observed("pop")
    async def pop(self, session: str) -> StoredMessage | None:
        """Take the newest message off the session and return it; ``None`` when it is empty.

        Read and delete are one step: two pods popping at once take two
        messages, and a retried pop whose reply was lost returns the message
        it took. Lock-free like an append (it counts as one against the write
        rate); the history is no longer append-only, so the epoch is bumped
        and the cached summary dropped if it covered that message.
        """
        return await self._editor.pop(session)

    async def pin(self, session: str, entry_id: str, pinned: bool = True) -> bool:
        """Pin (or unpin) a stored message: views send it always. False: no such entry."""
        return await self._editor.pin(session, entry_id, pinned)

    async def set_ttl(self, session: str, seconds: int | None) -> None:
        """Give this session its own TTL (moved on by writes); ``None``: it never expires.

        As with the default TTL, the session expires between ``seconds`` and a
        tenth more (a minute at most) after its last write.

        Raises:
            SessionNotFoundError: The session does not exist.
        """
        await self._editor.set_ttl(session, seconds)

    @observed("delete")
    async def delete(self, session: str) -> bool:
        """Delete a session and everything of it. True if it existed."""
        return await self._editor.delete(session)

    # -- moving through the history ---------------------------------------------

    @observed("checkpoint")
    async def checkpoint(self, session: str, name: str | None = None) -> Checkpoint:
        """Record where the session is now, and the summary in force, in constant time.

        Raises:
            SessionNotFoundError, QuotaExceededError: No session; too many checkpoints.
        """
        return await self._checkpoints.record(session, name)

    async def checkpoints(self, session: str) -> list[Checkpoint]:
        """The session's checkpoints, oldest first."""
        return await self._checkpoints.read(session)

    async def delete_checkpoint(self, session: str, checkpoint_id: str) -> bool:
        """Drop a checkpoint (its quota and bytes are given back); False if there was none."""
        return await self._checkpoints.delete(session, checkpoint_id)

    @observed("rewind")
    async def rewind(
        self, session: str, to: str | Checkpoint, *, lease: Lease | None = None
    ) -> RewindResult:
        """End the history at ``to`` (a checkpoint, or an entry id), for every pod at once.

        Fenced by the lease, as :meth:`replace` (``lease``: one held, consumed);
        what came after becomes a branch (:meth:`read_branch`), never destroyed
        (:mod:`ctxstore._parts.branches`).

        Raises:
            EntryNotFoundError, SessionNotFoundError: No such target, or session.
            LeaseHeldError, LeaseLostError: The lease was held, or lost before the write.
        """
        return await self._branches.rewind(session, to, lease=lease)

    @observed("fork")
    async def fork(
        self, session: str, new_session: str, *, at: str | Checkpoint | None = None
    ) -> ForkResult:
        """Start ``new_session`` with ``session``'s history up to ``at`` (default: its end).

        In bounded time: the history is shared, not copied; views stay one
        round trip; the two then diverge (:mod:`ctxstore._parts.forks`). ``at``: a
        checkpoint (or its id) or an entry id.

        Raises:
            SessionNotFoundError, SessionExistsError: No source; the fork's id is taken.
            EntryNotFoundError, QuotaExceededError: ``at`` is not in its history; a quota.
        """
        return await self._forks.fork(session, new_session, at)

    async def branches(self, session: str) -> list[Branch]:
        """The tails the session's rewinds abandoned, oldest first."""
        return await self._branches.read_all(session)

    async def read_branch(
        self, session: str, branch_id: str, *, after: str | None = None, limit: int = 1000
    ) -> HistoryPage:
        """One page (up to ``limit``) of a branch's messages, oldest first (as :meth:`read`).

        Raises:
            EntryNotFoundError: No such branch.
            CorruptEntryError: Its entries have expired.
        """
        return await self._branches.read(session, branch_id, after=after, limit=limit)

    # -- export and import -------------------------------------------------------

    def export_session(self, session: str, *, clear: bool = False) -> AsyncIterator[str]:
        """The session as JSON Lines (no newlines), a page at a time.

        The format is :mod:`ctxstore._parts.archive`'s.

        Sealed messages stay sealed unless ``clear`` (the store must hold the key).

        Raises:
            SessionNotFoundError, DecryptionError: No session; a value it cannot open.
        """
        return self._archive.export(session, clear=clear)

    async def import_sessions(
        self,
        lines: AsyncIterable[str] | Iterable[str],
        *,
        session: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[ImportResult]:
        """Import an export's sessions, each whole or not at all; one result per session.

        Again: nothing changes. ``session``: its one session's new id;
        ``progress``: called with 1 per message read.

        Raises:
            MalformedArchiveError: A bad line (its number said); nothing of its session written.
            SessionExistsError, QuotaExceededError: That session exists; a quota.
        """
        return await self._archive.load(lines, session=session, progress=progress)

    # -- reads -----------------------------------------------------------------

    async def read(
        self, session: str, *, after: str | None = None, limit: int = 1000
    ) -> HistoryPage:
        """One page (up to ``limit``, 1 to 10,000) of the full history, oldest first.

        ``after``: the previous page's ``next_after``; ``None`` to start.
        """
        return await self._reader.page(session, after=after, limit=limit)

    async def tail(self, session: str, limit: int) -> list[StoredMessage]:
        """The newest ``limit`` (1 to 10,000) messages, oldest first: one read of ``limit``."""
        return await self._reader.tail(session, limit)

    def iter_history(self, session: str) -> AsyncIterator[StoredMessage]:
        """Every stored message, oldest first (EpochChangedError across a replace)."""
        return self._reader.history(session)

    async def get_messages(self, session: str) -> list[dict[str, Any]]:
        """The full history, uncompacted, as appended (one epoch's, even across a replace)."""
        return await self._reader.messages(session)

    async def get_entry(self, session: str, entry_id: str) -> StoredMessage | None:
        """One stored message by entry id (e.g. the full text of an offloaded result)."""
        return await self._reader.entry(session, entry_id)

    @observed("view", record_view)
    async def view(
        self,
        session: str,
        *,
        token_budget: int | None = None,
        provider: Any | None = None,
        model: str | None = None,
    ) -> RequestView:
        """The messages to send before a model call: one round trip, no model call.

        System and pinned messages, the cached summary, then the newest
        messages that fit, in order, tool exchanges whole, orphans repaired.
        ``stats.over_budget``: system and pinned alone exceed the budget (only
        they are sent). The cost follows the budget, not the history's length.

        Args:
            session: The session id.
            token_budget: In the model's tokens; else the provider's window, else
                the settings' default (:func:`~ctxstore.budget.resolve_budget`).
            provider: An Amplifier provider, for its window.
            model: The model's name, for the safety factor.
        """
        return await self._viewer.request(session, token_budget, provider, model)

    async def get_messages_for_request(
        self, session: str, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        """The messages of :meth:`view`, as the Amplifier protocol names it."""
        return (await self.view(session, token_budget=token_budget, provider=provider)).messages

    async def record_usage(
        self, view: RequestView, input_tokens: int, *, model: str, overhead_tokens: int = 0
    ) -> float:
        """Learn the model's tokens per stored token from what the provider billed for ``view``.

        Budgets then use that ratio (plus ``token_ratio_margin``) for this
        model, in every pod of the tenant, instead of the configured guess.

        Args:
            view: The view that was sent.
            input_tokens: The input tokens the provider reported for the request.
            model: The model, as passed to :meth:`view`.
            overhead_tokens: Of ``input_tokens``, those not from the view
                (tool schemas, instructions sent outside it).

        Returns:
            The factor now in force for ``model``.
        """
        return await self._ratios.usage(view, input_tokens, model, overhead_tokens)

    async def record_overflow(self, *, model: str) -> float:
        """The provider refused a view as too long: views for ``model`` get smaller, now.

        Returns:
            The factor now in force for ``model`` (it grew by at least 15%).
        """
        return await self._ratios.overflow(model)

    async def info(self, session: str, *, pins: bool = True) -> SessionInfo:
        """The session's counters, times, pins and summary state (``pins=False``: no pins)."""
        return await self._reader.info(session, pins=pins)

    # -- search ----------------------------------------------------------------

    @observed("search")
    async def search(self, session: str, query: str, *, limit: int = 5) -> list[SearchHit]:
        """The entries of the whole history that best match ``query`` (BM25), best first.

        Text, tool arguments and tool results of every format are searched,
        however long ago and whether or not a view still sends them. Whatever
        was appended since the index was last brought up to date (the worker
        does it after each summary) is indexed first. The cost follows the
        query's matches, not the history's length (:mod:`ctxstore._parts.search`).

        Args:
            session: The session id.
            query: Words to look for (up to 2,000 characters); a query of
                common words only finds nothing.
            limit: The most results (1 to 100).

        Raises:
            InvalidInputError: The query is not a string or too long, or the limit is out of range.
        """
        return await self._searcher.search(session, query, limit)

    async def index(self, session: str) -> int:
        """Bring the session's search index up to date (the worker's step); the entries added."""
        return await self._searcher.index(session)

    # -- summaries -------------------------------------------------------------

    @observed("summarize")
    async def summarize(self, session: str, summarizer: Summarizer) -> SummaryOutcome:
        """Bring the session's cached summary up to date: the job a worker runs.

        Raises:
            LeaseHeldError: Someone else holds the lease; try again later.
            SummarizerError: It failed (``SummarizerUnavailableError``: retry later).
        """
        return await self._summaries.run(session, self._observer.summarizer(summarizer))

    async def request_summary(self, session: str, *, force: bool = False) -> int:
        """Flag the session for a summary; the generation to queue (0: none; ``force``: anyway)."""
        return await self._summaries.request(session, force=force)

    # -- the tenant ------------------------------------------------------------

    async def list_sessions(
        self, *, limit: int = 100, before_ms: int | None = None
    ) -> list[SessionSummary]:
        """The tenant's sessions, most recently active first (``limit``: 1 to 10,000).

        ``before_ms``: only sessions active before then (the last row's, to page).
        """
        return await self._index.sessions(limit=limit, before_ms=before_ms)

    async def list_tenants(self) -> list[str]:
        """Every tenant that has written a session (a tenant's own ACL user may not ask)."""
        return await self._index.tenants()

    async def limits(self, *, session: str | None = None) -> TenantLimits:
        """This tenant's own limits, as stored (``None`` fields: the settings' defaults)."""
        return await self._quotas.own(session)

    async def set_limits(self, limits: TenantLimits) -> None:
        """Set this tenant's quotas and retention (an operator's call; applies within 30 s)."""
        await self._quotas.set(limits)

    async def forget_tenant(self) -> int:
        """Delete every session of this tenant and its own keys; the sessions deleted.

        Walks the tenant's index (never ``KEYS``). Stop its writers first.

        Raises:
            ForgetIncompleteError: Something could not be deleted (the rest was).
        """
        parts = (self._index, self._quotas, self._handoff, self._lineage, self._viewer.warm)
        return await forget_tenant(self._scope, *parts)
