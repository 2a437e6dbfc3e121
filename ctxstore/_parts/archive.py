"""Export and import: sessions as JSON Lines, to move them between deployments.

One session is a run of lines, each a JSON object whose ``ctxstore`` key says
what it is::

    {"ctxstore": "session", "version": 1, "tenant": ..., "session": ..., "count": ..., ...}
    {"ctxstore": "message", "id": "1714...-0", "tokens": 12, "message": {...}}
    {"ctxstore": "message", "id": ..., "tokens": ..., "sealed": "<base64>", "aad": "<session>"}
    {"ctxstore": "summary", "covers": ..., "covered_tokens": ..., "ledger": ..., ...}
    {"ctxstore": "checkpoint", "id": "cp-2", "entry_id": ..., "count": ..., "summary": {...}}
    {"ctxstore": "end", "session": ..., "count": ..., "digest": ...}

(:mod:`ctxstore._layout.archive` holds every line's schema.)

Messages keep their entry ids (pins and checkpoints name them), a ``pinned``
flag, and the call ids that tie a reasoning item to the item after it. An
export is written a page at a time (:meth:`Archive.export`): its memory does
not grow with the history. A sealed value (a message, a summary's text, a
checkpoint's name) is exported as stored (with the session its seal is bound
to) unless the caller has the key and asks for it in clear; it imports only
into the tenant that sealed it, where that key is in the keyring, and is
sealed again for the session it goes to.

An import (:meth:`Archive.load`) parses every line of a session against one
strict schema before anything of it is staged, and stages its messages, a
batch at a time, in keys of that session's slot that nothing reads; the
session appears only at its ``end`` line, in one step (``import_commit.lua``).
A malformed line is refused with its number, and nothing of that session is
written. The session's digest is recorded with it: importing the same file
again changes nothing, and an import never writes over a session that exists.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from typing import Any

from ctxstore._layout.archive import FORMAT_VERSION, EndLine, SessionLine, parse_line
from ctxstore._layout.chain import row_fields
from ctxstore._layout.codec import (
    SUMMARY_COPY,
    Kind,
    Meta,
    current_covers,
    raw_pairs,
    text,
)
from ctxstore._layout.formats import REASONING_TIE, entry_order
from ctxstore._parts.checkpoints import Checkpoints, sealed_name
from ctxstore._parts.reads import Reader
from ctxstore._parts.scope import Scope
from ctxstore._parts.staging import StagedSession
from ctxstore._parts.writes import Writer
from ctxstore._tenant.quotas import Quotas
from ctxstore.encryption import MAGIC
from ctxstore.errors import (
    CtxstoreError,
    InvalidIdError,
    InvalidInputError,
    MalformedArchiveError,
    SessionNotFoundError,
)
from ctxstore.models import ImportResult

__all__ = ["FORMAT_VERSION", "Archive"]


class Archive:
    """One tenant's exports and imports.

    Args:
        scope: The tenant's scope.
        reader: Reads the history to export.
        writer: Validates and serializes imported messages, and lists the session.
        checkpoints: The checkpoints to export.
        quotas: The tenant's limits.
    """

    def __init__(
        self,
        scope: Scope,
        reader: Reader,
        writer: Writer,
        checkpoints: Checkpoints,
        quotas: Quotas,
    ) -> None:
        self._scope = scope
        self._reader = reader
        self._writer = writer
        self._checkpoints = checkpoints
        self._quotas = quotas

    # -- export ------------------------------------------------------------------

    async def export(self, session: str, *, clear: bool) -> AsyncIterator[str]:
        """The session as JSON Lines, a page at a time (see ``ContextStore.export_session``).

        Raises:
            SessionNotFoundError: The session does not exist.
            DecryptionError: ``clear`` was asked for a sealed value this store cannot open.
            EpochChangedError: A rewrite came while it was read.
        """
        keys = self._scope.keys(session)
        meta, view, keep, pttl = await self._scope.connection.transaction(
            [
                (
                    *("HMGET", keys.meta, Meta.SEQ, Meta.EPOCH, Meta.LIFE, Meta.COUNT),
                    *(Meta.TOKENS, Meta.LAST_ID, Meta.WATERMARK, Meta.WATERMARK_TOKENS, Meta.TTL),
                ),
                ("HMGET", keys.view, *SUMMARY_COPY),
                ("HGETALL", keys.keep),
                ("PTTL", keys.meta),
            ],
            session=session,
            key=keys.meta,
        )
        seq, epoch, life, count, tokens, last, wm, wm_tokens, own_ttl = meta
        if seq is None:
            raise SessionNotFoundError(
                "no such session", tenant=self._scope.tenant, session=session, key=keys.meta
            )
        ttl = int(own_ttl) if own_ttl is not None else (int(pttl) if int(pttl) > 0 else 0)
        pinned = {text(k) for k, v in raw_pairs(keep) if v[:1] == Kind.PINNED.encode()}
        digest = hashlib.sha256()

        def line(value: dict[str, Any], *, content: bool = True) -> str:
            encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            if content:
                digest.update(encoded.encode() + b"\n")
            return encoded

        yield line(
            {
                "ctxstore": "session",
                "version": FORMAT_VERSION,
                "tenant": self._scope.tenant,
                "session": session,
                "count": int(count or 0),
                "tokens": int(tokens or 0),
                "epoch": int(epoch or 0),
                "ttl_seconds": ttl // 1000 or None,
                "exported_at_ms": self._scope.wall_ms(),
            },
            content=False,
        )
        end = entry_order(text(last)) if last else None
        after: str | None = None
        exported = 0
        size = self._scope.settings.history_page_size
        while end is not None:
            state, rows = await self._reader.rows(session, keys, after, size)
            if state != (epoch, life):
                raise InvalidInputError(
                    "the session was rewritten while it was exported: export it again",
                    tenant=self._scope.tenant,
                    session=session,
                )
            for owner, row in rows:
                entry_id = text(row[0])
                if entry_order(entry_id) > end:
                    break  # appended since the export began: the next export's
                yield line(self._message(session, owner, row, entry_id in pinned, clear))
                exported += 1
            else:
                if len(rows) == size:
                    after = text(rows[-1][1][0])
                    continue
            break
        covers = current_covers(view[4], view[5], epoch or b"0", wm)
        if covers:
            summary = dict(zip(SUMMARY_COPY, view, strict=True))
            yield line(self._summary(session, covers, int(wm_tokens or 0), summary, clear))
        for point in await self._checkpoints.read(session, opened=False):
            if point.branch is None:  # those on branches point outside the history
                yield line(await self._checkpoint(session, point, clear))
        yield line(
            {
                "ctxstore": "end",
                "session": session,
                "count": exported,
                "digest": digest.hexdigest(),
            },
            content=False,
        )

    def _message(
        self, session: str, owner: str, row: Any, pinned: bool, clear: bool
    ) -> dict[str, Any]:
        fields = row_fields(row)
        value = fields[b"m"]
        out: dict[str, Any] = {
            "ctxstore": "message",
            "id": text(row[0]),
            "tokens": int(fields[b"t"]),
        }
        out.update(self._value("message", owner, value, clear, session))
        calls = [
            i for i in text(fields.get(b"c", b"")).split("\x1f") if i.startswith(REASONING_TIE)
        ]
        results = [
            i for i in text(fields.get(b"r", b"")).split("\x1f") if i.startswith(REASONING_TIE)
        ]
        if calls:
            out["ties"] = calls
        if results:
            out["tied"] = results
        if pinned:
            out["pinned"] = True
        return out

    def _value(
        self, name: str, owner: str, value: bytes, clear: bool, session: str
    ) -> dict[str, Any]:
        """A stored value as a line holds it: in clear (parsed), or sealed (base64)."""
        if value.startswith(MAGIC) and not clear:
            return {"sealed": base64.b64encode(value).decode(), "aad": owner}
        opened = self._scope.codec.open(owner, value)
        if name == "message":
            return {"message": json.loads(opened)}
        return {name: opened.decode()}

    def _summary(
        self, session: str, covers: str, covered: int, fields: dict[str, Any], clear: bool
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ctxstore": "summary",
            "covers": covers,
            "covered_tokens": covered,
            "model": text(fields.get("model") or b""),
        }
        out.update(self._summary_texts(session, fields, clear))
        return out

    def _summary_texts(self, session: str, fields: dict[str, Any], clear: bool) -> dict[str, Any]:
        """A summary's ledger, narrative and state, in clear or sealed."""
        out: dict[str, Any] = {}
        for name, field in (("ledger", "l1"), ("narrative", "l2"), ("state", "state")):
            value = fields.get(field) or b""
            if not value:
                continue
            if value.startswith(MAGIC) and not clear:
                out[name + "_sealed"] = base64.b64encode(value).decode()
                out["aad"] = session
            else:
                out[name] = self._scope.codec.open(session, value).decode()
        return out

    async def _checkpoint(self, session: str, point: Any, clear: bool) -> dict[str, Any]:
        keys = self._scope.keys(session)
        names = [f"{point.checkpoint_id}:{name}" for name in SUMMARY_COPY]
        (values,) = await self._scope.connection.transaction(
            [("HMGET", keys.checkpoint_summaries, *names)], session=session, key=keys.meta
        )
        summary = None
        if point.summary_covers:
            fields = dict(zip(SUMMARY_COPY, values, strict=True))
            summary = {
                "covers": point.summary_covers,
                "covered_tokens": point.covered_tokens,
                "model": text(fields.get("model") or b""),
                **self._summary_texts(session, fields, clear),
            }
        name: dict[str, Any] = {"name": point.name}
        sealed = sealed_name(point.name or "")
        if sealed is not None:
            name = (
                {"name": self._scope.codec.open(session, base64.b64decode(sealed)).decode()}
                if clear
                else {"name_sealed": sealed, "aad": session}
            )
        return {
            "ctxstore": "checkpoint",
            "id": point.checkpoint_id,
            **name,
            "entry_id": point.entry_id,
            "seq": point.seq,
            "epoch": point.epoch,
            "count": point.count,
            "tokens": point.tokens,
            "created_ms": point.created_ms,
            "summary": summary,
        }

    # -- import ------------------------------------------------------------------

    async def load(
        self,
        lines: AsyncIterable[str] | Iterable[str],
        *,
        session: str | None,
        progress: Callable[[int], None] | None = None,
    ) -> list[ImportResult]:
        """Import the sessions of an export (see ``ContextStore.import_sessions``)."""
        if session is not None:
            self._scope.keys(session)
        results: list[ImportResult] = []
        current: StagedSession | None = None
        number = 0
        try:
            async for raw in _lines(lines):
                number += 1
                if not raw.strip():
                    continue
                line, encoded = parse_line(number, raw)
                if isinstance(line, SessionLine):
                    if current is not None:
                        raise MalformedArchiveError(
                            number, f"session {current.source} has no end line before this one"
                        )
                    if session is not None and results:
                        raise MalformedArchiveError(
                            number, "the session to import into is named, and the input holds more"
                        )
                    current = await self._begin(number, line, session)
                elif current is None:
                    raise MalformedArchiveError(number, "a line before any session line")
                elif isinstance(line, EndLine):
                    finishing, current = current, None  # it drops its staging if refused
                    results.append(await finishing.finish(number, line))
                else:
                    await current.add(number, line, encoded)
                    if progress is not None and line.ctxstore == "message":
                        progress(1)
            if current is not None:
                raise MalformedArchiveError(number, f"session {current.source} has no end line")
        except BaseException:
            # Whatever stops it (a bad line, the input failing, a cancel): nothing staged stays.
            if current is not None:
                with contextlib.suppress(CtxstoreError):
                    await current.abandon()
            raise
        return results

    async def _begin(self, number: int, line: SessionLine, into: str | None) -> StagedSession:
        target = into or line.session
        try:
            self._scope.keys(target)  # its keys must fit the tenant's too
        except InvalidIdError as exc:
            raise MalformedArchiveError(number, str(exc)) from exc
        limits = await self._quotas.resolved(target)
        return StagedSession(self._scope, self._writer, line.tenant, line.session, target, limits)


async def _lines(source: AsyncIterable[str] | Iterable[str]) -> AsyncIterator[str]:
    if isinstance(source, AsyncIterable):
        async for line in source:
            yield line
    else:
        for line in source:
            yield line
