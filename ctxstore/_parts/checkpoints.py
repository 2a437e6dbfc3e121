"""Checkpoints: where a session was, recorded in one step, to rewind or fork from later.

A checkpoint (``checkpoint.lua``) records the session's position (its last
entry, sequence number, epoch, messages and tokens) and a copy of the summary
in force, as stored, in the session's slot: it reads nothing of the stream,
so it costs the same at any history's length. Summaries move on without it
(a commit never touches checkpoints); a rewind to it puts its summary back
when the one in force covers entries the rewind abandons.

Checkpoints count against the tenant's ``checkpoints`` quota (per session)
and their summaries against the session's bytes; they expire with the
session, go with ``delete`` and ``forget_tenant``, and with the history
they point into when a ``replace`` or ``clear`` supersedes it. One whose entry
a rewind abandoned names that branch (``Checkpoint.branch``).

A checkpoint's name is content (people write what they were doing in it): with
encryption on it is sealed for the session like the messages are, and stored
as :data:`SEALED_NAME` and the sealed value's base64 (:func:`stored_name`).
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from ctxstore._layout.codec import Codec, Reply, raw_pairs, text
from ctxstore._layout.validate import check_entry_id, check_label, check_numbered_id
from ctxstore._parts.scope import Scope
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.quotas import Quotas, quota_error
from ctxstore.errors import CorruptEntryError, EntryNotFoundError, SessionNotFoundError
from ctxstore.lease import clock_arg
from ctxstore.models import Checkpoint

__all__ = ["SEALED_NAME", "Checkpoints", "checkpoint_id", "sealed_name", "stored_name"]

SEALED_NAME = "\x00"
"""A stored name that starts with it is sealed (its base64 follows): a given name is
printable, so it never does."""


def stored_name(codec: Codec, session: str, name: str | None) -> str:
    """A checkpoint's name as it is stored: sealed when encryption is on ('' for none)."""
    if not name or codec.keyring is None:
        return name or ""
    return SEALED_NAME + base64.b64encode(codec.seal(session, name.encode())).decode()


def sealed_name(stored: str) -> str | None:
    """The base64 of a stored name's sealed value, or ``None`` when it is stored in clear."""
    return stored.removeprefix(SEALED_NAME) if stored.startswith(SEALED_NAME) else None


def checkpoint_id(value: object, session: str | None = None) -> str:
    """Return ``value`` if it has a checkpoint id's form (``cp-<number>``).

    Raises:
        InvalidInputError: It does not.
    """
    return check_numbered_id(value, "cp", "checkpoint", session)


class Checkpoints:
    """One tenant's checkpoints.

    Args:
        scope: The tenant's scope.
        quotas: The tenant's limits (the ``checkpoints`` quota).
    """

    def __init__(self, scope: Scope, quotas: Quotas) -> None:
        self._scope = scope
        self._quotas = quotas

    async def record(self, session: str, name: str | None) -> Checkpoint:
        """Record where the session is now (see ``ContextStore.checkpoint``)."""
        keys = self._scope.keys(session)
        if name is not None:
            check_label(name, "a checkpoint's name", session=session)
        limits = await self._quotas.resolved(session)
        stored = stored_name(self._scope.codec, session, name)
        reply = await self._scope.connection.script(
            SCRIPTS.checkpoint,
            (
                keys.meta,
                keys.view,
                keys.checkpoints,
                keys.checkpoint_summaries,
                keys.idem,
                keys.idem_old,
            ),
            (
                secrets.token_urlsafe(9),  # this call's id: a retry gets the same checkpoint
                stored,
                limits.checkpoints,
                limits.session_bytes,
                limits.appends_per_second,
                limits.append_burst,
                self._scope.period_ms,
                clock_arg(self._scope.clock),
            ),
            session=session,
            replicas=self._scope.settings.replica_acks,
        )
        status = text(reply[0])
        if status == Reply.QUOTA:
            raise quota_error(
                reply, tenant=self._scope.tenant, session=session, key=keys.checkpoints
            )
        if status != Reply.OK:
            raise SessionNotFoundError(
                "no such session", tenant=self._scope.tenant, session=session, key=keys.meta
            )
        return self._parse(session, text(reply[1]), reply[2])

    async def read(self, session: str, *, opened: bool = True) -> list[Checkpoint]:
        """The session's checkpoints, oldest first (see ``ContextStore.checkpoints``).

        Args:
            session: The session.
            opened: Open sealed names; with False each ``name`` is as stored
                (an export writes a sealed one as it is).
        """
        keys = self._scope.keys(session)
        (raw,) = await self._scope.connection.transaction(
            [("HGETALL", keys.checkpoints)], session=session, key=keys.checkpoints
        )
        found = [self._parse(session, text(k), v, opened=opened) for k, v in raw_pairs(raw)]
        return sorted(found, key=lambda c: int(c.checkpoint_id[3:]))

    async def get(self, session: str, checkpoint: str, *, opened: bool = True) -> Checkpoint:
        """One checkpoint by id (its name as stored unless ``opened``).

        Raises:
            EntryNotFoundError: The session has no such checkpoint.
        """
        keys = self._scope.keys(session)
        checkpoint_id(checkpoint, session)
        raw = await self._scope.named(session, keys.checkpoints, checkpoint, "checkpoint")
        return self._parse(session, checkpoint, raw, opened=opened)

    async def resolve(self, session: str, to: object) -> tuple[str, Checkpoint | None]:
        """The entry a rewind or a fork goes to, and the checkpoint it was named by (if one).

        ``to`` is a checkpoint, its id (``cp-3``) or an entry id.

        Raises:
            EntryNotFoundError: The checkpoint is unknown, or on an abandoned branch.
            InvalidInputError: ``to`` is neither a checkpoint nor an entry id.
        """
        given = to if isinstance(to, Checkpoint) else None
        if given is not None:
            to = given.checkpoint_id
        if not (isinstance(to, str) and to.startswith("cp-")):
            return check_entry_id(to, session), None
        point = await self.get(session, to, opened=False)  # its name plays no part
        if given is not None and (point.entry_id, point.created_ms) != (
            given.entry_id,
            given.created_ms,
        ):
            # Ids are per session: another session's cp-1 is not this one's.
            raise EntryNotFoundError(
                f"the checkpoint given is not this session's {to} (another session's, "
                "or one recorded before a delete)",
                tenant=self._scope.tenant,
                session=session,
            )
        if point.branch is not None:
            raise EntryNotFoundError(
                f"checkpoint {to} is on branch {point.branch}, not in the history",
                tenant=self._scope.tenant,
                session=session,
            )
        return point.entry_id, point

    async def delete(self, session: str, checkpoint: str) -> bool:
        """Drop a checkpoint; False when there was none (see ``ContextStore.delete_checkpoint``)."""
        keys = self._scope.keys(session)
        checkpoint_id(checkpoint, session)
        found = await self._scope.connection.script(
            SCRIPTS.checkpoint_delete,
            (keys.meta, keys.checkpoints, keys.checkpoint_summaries, keys.idem, keys.idem_old),
            (checkpoint, secrets.token_urlsafe(9), self._scope.period_ms),
            session=session,
        )
        return int(found) == 1

    def _parse(self, session: str, checkpoint: str, raw: Any, *, opened: bool = True) -> Checkpoint:
        """A checkpoint from its record (``checkpoint.lua``'s JSON).

        Raises:
            CorruptEntryError: The record is not one.
            DecryptionError: Its name is sealed and does not open here (``opened``).
        """
        try:
            record = json.loads(raw)
            name = str(record["name"])
            sealed = sealed_name(name)
            if opened and sealed is not None:
                name = self._scope.codec.open(session, base64.b64decode(sealed)).decode()
            return Checkpoint(
                checkpoint_id=checkpoint,
                entry_id=str(record["entry_id"]),
                seq=int(record["seq"]),
                epoch=int(record["epoch"]),
                count=int(record["count"]),
                tokens=int(record["tokens"]),
                created_ms=int(record["made"]),
                name=name or None,
                summary_covers=str(record["covers"]) or None,
                branch=str(record["branch"]) or None,
                covered_tokens=int(record["wm_tokens"]),
            )
        except (ValueError, TypeError, KeyError) as exc:  # binascii's and UTF-8's errors too
            raise CorruptEntryError(
                f"checkpoint {checkpoint} cannot be read: {exc}",
                tenant=self._scope.tenant,
                session=session,
                key=self._scope.keys(session).checkpoints,
            ) from exc
