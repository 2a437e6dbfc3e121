"""The only place key strings are formatted, and ids are validated.

Every key of one session shares the hash tag ``{tenant:session}``, so every
script touches one cluster slot and the same code runs on one Redis and on
Redis Cluster. The tenant's own keys carry the tag ``{tenant}``.

An id is an ASCII letter, digit or underscore, then up to 127 of those, ``.``
or ``-``, and never ``..``. Everything else is refused: braces would move the
hash tag, ``:`` would forge another key's layout, ``*?[]`` are glob syntax in
ACL key patterns and SCAN, whitespace and control characters break logs and
the protocol, and non-ASCII letters allow look-alikes of another tenant's id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ctxstore.errors import ConfigurationError, InvalidIdError

MAX_ID_LENGTH = 128

_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


def validate_id(value: object, kind: str) -> str:
    """Return ``value``, as an exact ``str``, if it is a valid tenant or session id.

    A ``str`` subclass is taken for its characters alone: its own ``__format__``,
    ``__eq__`` or ``__hash__`` never decides which keys it names.

    Args:
        value: The candidate id.
        kind: ``"tenant"`` or ``"session"``, for the error message.

    Raises:
        InvalidIdError: The id is not a string, is empty, longer than 128
            characters, or holds a character outside the allowed set.
    """
    if not isinstance(value, str):
        raise InvalidIdError(f"{kind} id must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidIdError(f"{kind} id is empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(f"{kind} id is {len(value)} characters, over {MAX_ID_LENGTH}")
    if _ID.fullmatch(value) is None or ".." in value:
        raise InvalidIdError(
            f"{kind} id {value!r} may hold only ASCII letters, digits, '_', '.' and '-' "
            "(starting with a letter, digit or '_', and no '..')"
        )
    return str.__str__(value)  # the same object for a str; a plain copy for a subclass


def validate_prefix(value: str) -> str:
    """Return ``value`` if it can prefix keys safely.

    Raises:
        ConfigurationError: The prefix is empty or holds unsafe characters.
    """
    if _PREFIX.fullmatch(value) is None or ".." in value:
        raise ConfigurationError(f"key prefix {value!r} is not a safe key prefix")
    return value


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session; all in the slot of ``{tenant:session}``.

    Attributes:
        log: Stream, one entry per message.
        meta: Hash: epoch, seq, count, tokens, ids, watermark, fence.
        view: Hash: the cached summary (the compacted view).
        lease: Hash: the lease holder's token, fence and expiry.
        idem: Hash: idempotency key -> entry id, the current generation.
        idem_old: The previous generation of ``idem``.
        keep: Hash: entry id -> kind of the messages every view must send.
        anchor: Hash: where the view starts, per budget (and the summary it sends).
        index: Hash: the history's search index (:mod:`ctxstore._parts.search`).
        checkpoints: Hash: checkpoint id -> where the session was
            (:mod:`ctxstore._parts.checkpoints`).
        checkpoint_summaries: Hash: ``<checkpoint id>:<field>`` -> the summary in force then.
        branches: Hash: branch id -> an abandoned tail a rewind left
            (:mod:`ctxstore._parts.lineage`).
        gone: String: a deleted session's tombstone (its next epoch and sequence).
    """

    log: str
    meta: str
    view: str
    lease: str
    idem: str
    idem_old: str
    keep: str
    anchor: str
    index: str
    checkpoints: str
    checkpoint_summaries: str
    branches: str
    gone: str

    def all(self) -> tuple[str, ...]:
        """Every key of the session, in a fixed order (the tombstone last).

        Not its segments (:func:`segment_keys`): they outlive it while a fork reads them.
        """
        return (
            self.log,
            self.meta,
            self.view,
            self.lease,
            self.idem,
            self.idem_old,
            self.keep,
            self.anchor,
            self.index,
            self.checkpoints,
            self.checkpoint_summaries,
            self.branches,
            self.gone,
        )


@lru_cache(maxsize=4096)
def valid_session_keys(prefix: str, tenant: str, session: str) -> SessionKeys:
    """The keys of a session whose id is validated here: a valid id is checked once.

    Every call of a store asks for them (a view twice). Only an exact ``str``
    may be looked up here (the caller makes one with :func:`validate_id`): a
    subclass's own ``__eq__`` and ``__hash__`` could find another id's keys.
    """
    return session_keys(prefix, tenant, validate_id(session, "session"))


def session_keys(prefix: str, tenant: str, session: str) -> SessionKeys:
    """Format the keys of one session (ids must be validated already)."""
    base = f"{prefix}:{{{tenant}:{session}}}:"
    return SessionKeys(
        log=base + "log",
        meta=base + "meta",
        view=base + "view",
        lease=base + "lease",
        idem=base + "idem",
        idem_old=base + "idem:old",
        keep=base + "keep",
        anchor=base + "anchor",
        index=base + "index",
        checkpoints=base + "ckpt",
        checkpoint_summaries=base + "ckpt:sum",
        branches=base + "branches",
        gone=base + "gone",
    )


@dataclass(frozen=True, slots=True)
class SegmentKeys:
    """The keys of one segment: a session's log, frozen; in that session's slot.

    Attributes:
        log: Stream: the entries, never written again.
        info: Hash: its last entry and the counters there, and who reads it.
    """

    log: str
    info: str


def segment_keys(prefix: str, tenant: str, owner: str, segment: str) -> SegmentKeys:
    """The keys of segment ``segment`` of session ``owner`` (ids validated already).

    ``segment`` is a random token (``A-Za-z0-9_-``): it cannot hold ``:``, a
    brace or a glob character.
    """
    base = f"{prefix}:{{{tenant}:{owner}}}:seg:{segment}"
    return SegmentKeys(log=base, info=base + ":i")


def staging_keys(prefix: str, tenant: str, session: str, token: str) -> tuple[str, str]:
    """Where an import stages a session before it appears: a stream and a keep hash.

    In the session's slot, so the import's last step renames them into place.
    """
    base = f"{prefix}:{{{tenant}:{session}}}:stage:{token}:"
    return base + "log", base + "keep"


def tenant_staging_key(prefix: str, tenant: str) -> str:
    """The sorted set of a tenant's imports in progress (``session token`` -> expiry, ms).

    An import that dies before its end line leaves its staged keys until they
    expire; ``delete`` and ``forget_tenant`` find them here and remove them.
    """
    return f"{prefix}:{{{tenant}}}:staging"


def tenant_sessions_key(prefix: str, tenant: str) -> str:
    """The sorted set of a tenant's sessions, scored by last activity (ms)."""
    return f"{prefix}:{{{tenant}}}:sessions"


def tenant_pending_keys(prefix: str, tenant: str) -> tuple[str, str]:
    """The tenant's pending reservations: a hash, and the same sessions by latest deadline.

    The hash maps a session to its reservations' tokens and deadlines.
    """
    return f"{prefix}:{{{tenant}}}:pending", f"{prefix}:{{{tenant}}}:pending_due"


def tenant_deleted_key(prefix: str, tenant: str) -> str:
    """The sorted set of a tenant's deleted sessions, by when their last keys expire (ms).

    A deleted session leaves a tombstone and its idempotency records for a
    while; ``forget_tenant`` finds them here (they are no longer listed).
    """
    return f"{prefix}:{{{tenant}}}:deleted"


def tenant_segments_key(prefix: str, tenant: str) -> str:
    """The sorted set of a tenant's segments (``owner:id`` -> when made, ms), for ``forget_tenant``.

    Segments outlive the session they were frozen from while forks read them:
    this is how a forget finds one whose every reader is gone.
    """
    return f"{prefix}:{{{tenant}}}:segments"


def tenant_ratios_key(prefix: str, tenant: str) -> str:
    """The hash of a tenant's learned model token ratios (model -> factor, ...)."""
    return f"{prefix}:{{{tenant}}}:ratios"


def tenant_limits_key(prefix: str, tenant: str) -> str:
    """The hash of a tenant's own quotas and retention (see ``TenantLimits``)."""
    return f"{prefix}:{{{tenant}}}:limits"


def tenants_key(prefix: str) -> str:
    """The set of every tenant that has written a session (for the worker's sweep)."""
    return f"{prefix}:tenants"


def tenant_key_pattern(prefix: str, tenant: str) -> str:
    """The ACL key pattern that covers every key of one tenant and nothing else.

    A tenant id never holds ``:`` or a brace, so ``{tenant:`` and ``{tenant}``
    cannot match another tenant whose id starts with this one.
    """
    return f"{prefix}:{{{tenant}:*"


def tenant_index_pattern(prefix: str, tenant: str) -> str:
    """The ACL key pattern of the tenant's own (non-session) keys."""
    return f"{prefix}:{{{tenant}}}:*"
