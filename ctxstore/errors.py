"""Every error ctxstore raises, under one root.

```
CtxstoreError                     root: catch this to catch everything ctxstore raises
├── ConfigurationError (ValueError) settings or a URL that cannot work
├── InvalidInputError (ValueError) bad input refused before anything is written
│   ├── InvalidIdError            a tenant or session id that could escape its key
│   ├── InvalidMessageError       a malformed message, unknown role, orphan field...
│   │   └── MessageTooLargeError  a message over the size cap (also a QuotaExceededError)
│   ├── EntryNotFoundError        a checkpoint, branch or entry id the session does not hold
│   └── MalformedArchiveError     an export's line that cannot be imported (its line number)
├── QuotaExceededError            a tenant quota would be exceeded; nothing was written
├── ConflictError                 an expected sequence number was stale
│   └── EpochChangedError         a replace or clear came between two reads of one history
├── LeaseError                    the session's lease
│   ├── LeaseHeldError            another holder kept it for longer than we would wait
│   └── LeaseLostError            ours expired or was taken over: our write was refused
├── BudgetExceededError           what must be kept is larger than the token budget
├── SessionNotFoundError          the session has no messages and no metadata
├── SessionExistsError            a fork or import would write over a session that exists
├── CorruptEntryError             a stored entry that cannot be decoded
│   └── DecryptionError           an encrypted value the keyring cannot open
├── SummarizerError               the summarizer failed (bad request, malformed answer)
│   └── SummarizerUnavailableError  rate limited, overloaded, down or slow: retry later
└── StoreError                    Redis failed in a way the caller cannot fix
    ├── StoreUnavailableError     Redis could not be reached in the time allowed
    ├── PermissionDeniedError     the Redis user may not run a command or touch a key
    ├── ForgetIncompleteError     forget_tenant deleted the sessions but not everything else
    └── ReplicationError          fewer replicas than asked acknowledged a write in time
```

Redis errors are translated at the store's edge and chained with ``from``; each
error names the tenant, session and key it is about when there is one.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "ConfigurationError",
    "ConflictError",
    "CorruptEntryError",
    "CtxstoreError",
    "DecryptionError",
    "EntryNotFoundError",
    "EpochChangedError",
    "ForgetIncompleteError",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "MalformedArchiveError",
    "MessageTooLargeError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "ReplicationError",
    "SessionExistsError",
    "SessionNotFoundError",
    "StoreError",
    "StoreUnavailableError",
    "SummarizerError",
    "SummarizerUnavailableError",
]


class CtxstoreError(Exception):
    """The root of every error ctxstore raises.

    Attributes:
        reason: What went wrong, without where (the message's first part).
        tenant: The tenant the error is about, when known.
        session: The session the error is about, when known.
        key: The Redis key the error is about, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        tenant: str | None = None,
        session: str | None = None,
        key: str | None = None,
    ) -> None:
        self.reason = message
        self.tenant = tenant
        self.session = session
        self.key = key
        where = [
            f"{name}={value!r}"
            for name, value in (("tenant", tenant), ("session", session), ("key", key))
            if value is not None
        ]
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class ConfigurationError(CtxstoreError, ValueError):
    """Settings, or a URL, that cannot work."""


class InvalidInputError(CtxstoreError, ValueError):
    """Input refused before anything was written."""


class InvalidIdError(InvalidInputError):
    """A tenant or session id that is empty, too long, or could escape its key."""


class InvalidMessageError(InvalidInputError):
    """A message that does not fit the message model.

    Attributes:
        index: The message's position in a batch, when it came in one.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        tenant: str | None = None,
        session: str | None = None,
        key: str | None = None,
    ) -> None:
        self.index = index
        prefix = f"message {index}: " if index is not None else ""
        # Named, not super(): MessageTooLargeError also derives from QuotaExceededError.
        CtxstoreError.__init__(self, prefix + message, tenant=tenant, session=session, key=key)


class EntryNotFoundError(InvalidInputError):
    """A checkpoint, branch or entry id that is not in the session (or not in its history)."""


class MalformedArchiveError(InvalidInputError):
    """A line of an export that cannot be imported; nothing of its session was written.

    Attributes:
        line: The line's number in the input, from 1.
    """

    def __init__(
        self,
        line: int,
        message: str,
        *,
        tenant: str | None = None,
        session: str | None = None,
    ) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}", tenant=tenant, session=session)


class QuotaExceededError(CtxstoreError):
    """A write that would take the tenant past one of its quotas; nothing was written.

    Attributes:
        quota: Which quota: ``message_bytes``, ``session_bytes``,
            ``session_tokens``, ``sessions``, ``appends_per_second`` or
            ``checkpoints``.
        limit: The quota.
        value: What the write would have made it.
    """

    def __init__(
        self,
        quota: str,
        limit: float,
        value: float,
        *,
        tenant: str | None = None,
        session: str | None = None,
        key: str | None = None,
    ) -> None:
        self.quota = quota
        self.limit = limit
        self.value = value
        CtxstoreError.__init__(
            self,
            f"quota {quota} exceeded: {value:g} over the limit of {limit:g}",
            tenant=tenant,
            session=session,
            key=key,
        )


class MessageTooLargeError(InvalidMessageError, QuotaExceededError):
    """A message whose JSON form is larger than the cap (the ``message_bytes`` quota).

    Attributes:
        size: The message's size in bytes.
        limit: The cap in bytes.
    """

    def __init__(
        self,
        size: int,
        limit: int,
        *,
        index: int | None = None,
        tenant: str | None = None,
        session: str | None = None,
    ) -> None:
        self.size = size
        self.quota = "message_bytes"
        self.value = size
        self.limit = limit
        InvalidMessageError.__init__(
            self,
            f"message is {size} bytes, over the {limit}-byte cap (quota message_bytes)",
            index=index,
            tenant=tenant,
            session=session,
        )


class ConflictError(CtxstoreError):
    """A conditional write whose expected sequence number was stale.

    Attributes:
        expected: The sequence number the caller expected.
        current: The session's sequence number when the write was refused.
    """

    def __init__(
        self,
        expected: int,
        current: int,
        *,
        tenant: str | None = None,
        session: str | None = None,
        key: str | None = None,
    ) -> None:
        self.expected = expected
        self.current = current
        super().__init__(
            f"expected sequence number {expected}, the session is at {current}",
            tenant=tenant,
            session=session,
            key=key,
        )


class EpochChangedError(ConflictError):
    """A replace or clear changed the history between two reads that had to agree.

    Attributes:
        expected: The epoch the first read saw.
        current: The epoch found later.
    """

    def __init__(
        self,
        expected: int,
        current: int,
        *,
        tenant: str | None = None,
        session: str | None = None,
        key: str | None = None,
    ) -> None:
        self.expected = expected
        self.current = current
        CtxstoreError.__init__(
            self,
            "the history was replaced or cleared while it was read "
            f"(epoch {expected} -> {current})",
            tenant=tenant,
            session=session,
            key=key,
        )


class LeaseError(CtxstoreError):
    """The session's lease could not be used."""


class LeaseHeldError(LeaseError):
    """Another holder kept the lease for longer than the caller would wait."""


class LeaseLostError(LeaseError):
    """Our lease expired or was taken over; the fenced write was refused."""


class BudgetExceededError(CtxstoreError):
    """What must always be sent (system and pinned messages) exceeds the budget.

    Attributes:
        budget: The token budget asked for.
        required: The tokens that cannot be dropped.
    """

    def __init__(
        self,
        budget: int,
        required: int,
        *,
        tenant: str | None = None,
        session: str | None = None,
    ) -> None:
        self.budget = budget
        self.required = required
        super().__init__(
            f"system and pinned messages need {required} tokens, over the budget of {budget}",
            tenant=tenant,
            session=session,
        )


class SessionNotFoundError(CtxstoreError):
    """The session has no messages and no metadata."""


class SessionExistsError(CtxstoreError):
    """A fork or an import would write over a session that already exists; nothing was written."""


class CorruptEntryError(CtxstoreError):
    """A stored entry that cannot be decoded."""


class DecryptionError(CorruptEntryError):
    """An encrypted value whose key is unknown, or that does not authenticate (wrong key)."""


class SummarizerError(CtxstoreError):
    """The summarizer failed in a way a retry will not fix."""


class SummarizerUnavailableError(SummarizerError):
    """The summarizer is rate limited, overloaded, down or too slow: retry later.

    Attributes:
        retry_after: Seconds the service asked us to wait, when it said.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class StoreError(CtxstoreError):
    """Redis failed in a way the caller cannot fix by changing its input."""


class StoreUnavailableError(StoreError):
    """Redis could not be reached, or did not answer, in the time allowed."""


class StoreFullError(StoreError):
    """Redis is past its ``maxmemory`` and evicts nothing (``noeviction``).

    It refuses writes until memory is freed (a session deleted, a TTL run out,
    ``maxmemory`` raised); reads and views still answer.
    """


class StoreClosedError(StoreUnavailableError):
    """The store was closed (:meth:`ContextStore.aclose`): a call made on it, or in flight then."""


class PermissionDeniedError(StoreError):
    """The Redis user may not run this command or touch this key (its ACL refused it)."""


class ForgetIncompleteError(StoreError):
    """``forget_tenant`` deleted what it could, but not everything.

    Attributes:
        deleted: Sessions deleted.
        remaining: What is left, in words (the tenant's limits, a summary job...).
    """

    def __init__(
        self, deleted: int, remaining: tuple[str, ...], *, tenant: str | None = None
    ) -> None:
        self.deleted = deleted
        self.remaining = remaining
        super().__init__(
            f"deleted {deleted} sessions, but could not delete {', '.join(remaining)}: "
            "run it again with an operator's credentials",
            tenant=tenant,
        )


class ReplicationError(StoreError):
    """Fewer replicas than ``Settings.replica_acks`` acknowledged a write in time.

    The write is on the primary; retrying with the same idempotency key is
    safe (it is answered as a duplicate, and waited for again).

    Attributes:
        acknowledged: Replicas that acknowledged it.
    """

    def __init__(
        self,
        message: str,
        *,
        acknowledged: int,
        tenant: str | None = None,
        session: str | None = None,
        key: str | None = None,
    ) -> None:
        self.acknowledged = acknowledged
        super().__init__(message, tenant=tenant, session=session, key=key)
