"""An import's staging: one session checked and staged line by line, written at its end.

:class:`StagedSession` takes the lines of one session of an export
(:mod:`ctxstore._parts.archive`) as they come: each is checked (and a sealed value
opened, then sealed again for its new home), messages are staged a batch at
a time (``import_stage.lua``) in keys of the target's slot that nothing
reads, and the session appears whole at the end line (``import_commit.lua``).
A refused line drops what was staged: nothing of the session is written.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from typing import Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import Reply, summary_message, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.validate import check_entry_id
from ctxstore._parts.checkpoints import checkpoint_id
from ctxstore._parts.scope import Scope
from ctxstore._parts.writes import Writer
from ctxstore._redis.connection import Commands
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.quotas import Limits, quota_error
from ctxstore.errors import (
    DecryptionError,
    InvalidInputError,
    MalformedArchiveError,
    QuotaExceededError,
    SessionExistsError,
    StoreUnavailableError,
)
from ctxstore.lease import clock_arg
from ctxstore.models import ImportResult
from ctxstore.tokens import count_message

__all__ = ["REASONING_TIE", "StagedSession"]

STAGE_BATCH = 500
"""Messages an import stages per round trip, at most."""
STAGE_BYTES = 1 << 20
"""Bytes of messages an import stages per round trip, at most (a batch ends at either)."""
STAGE_MS = 3_600_000
"""How long an import's staged batches last if it dies before its end line."""
REASONING_TIE = "~reasoning:"
_NO_STREAM_ID = ((0, 0), (2**64 - 1, 2**64 - 1))
"""Ids an import refuses: Redis takes no ``0-0``, and after the last one no append fits."""
"""The prefix of the ids that tie a reasoning item to the item after it (writes.py)."""


class StagedSession:
    """One session being imported: checked and staged line by line, written at its end.

    Args:
        scope: The tenant's scope (it is imported into this tenant).
        writer: Validates and serializes messages, and lists the session.
        tenant: The tenant it was exported from (its sealed values are bound to it).
        source: The session it was exported from.
        target: The session it is imported as.
        limits: The tenant's limits.
    """

    def __init__(
        self,
        scope: Scope,
        writer: Writer,
        tenant: str,
        source: str,
        target: str,
        limits: Limits,
    ) -> None:
        self.writer = writer
        self.tenant = tenant
        self.source = source
        self.target = target
        self.limits = limits
        self.scope = scope
        self.token = secrets.token_urlsafe(9)
        self.stage = _keys.staging_keys(scope.prefix, scope.tenant, self.target, self.token)
        self.digest = hashlib.sha256()
        self.batch: list[Any] = []
        self.count = 0
        self.tokens = 0
        self.bytes = 0
        self.pending = 0  # the bytes of the batch not staged yet
        self.first = ""
        self.last = ""
        self.summary: list[Any] = []
        self.summary_covers = ""
        self.summary_tokens = 0
        self.summary_line = 0
        self.points: list[tuple[int, str, str, dict[str, Any], list[Any]]] = []
        self.staged = False

    async def add(self, number: int, kind: Any, record: dict[str, Any]) -> None:
        """Check one line and take it in (messages are staged a batch at a time)."""
        self.digest.update(
            json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        )
        if kind == "message":
            await self._message(number, record)
        elif kind == "summary":
            self._summary(number, record)
        elif kind == "checkpoint":
            self._checkpoint(number, record)
        else:
            raise MalformedArchiveError(number, f"unknown line kind {kind!r}")

    async def _message(self, number: int, record: dict[str, Any]) -> None:
        entry_id = self._entry_id(number, record.get("id"))
        if entry_order(entry_id) in _NO_STREAM_ID:
            raise MalformedArchiveError(number, f"entry {entry_id} cannot be a stream entry's id")
        if self.last and entry_order(entry_id) <= entry_order(self.last):
            raise MalformedArchiveError(number, f"entry {entry_id} does not follow {self.last}")
        message = self._open_message(number, record)
        ties, tied = record.get("ties", []), record.get("tied", [])
        if (
            not _strings(ties)
            or not _strings(tied)
            or not all(t.startswith(REASONING_TIE) for t in (*ties, *tied))
        ):
            raise MalformedArchiveError(number, "ties and tied must be lists of reasoning ids")
        pinned = record.get("pinned", False)
        if not isinstance(pinned, bool):
            raise MalformedArchiveError(number, "pinned must be true or false")
        try:
            entry = self.writer.entry(
                self.target,
                message,
                self.limits,
                pinned=pinned,
                calls=tuple(ties),
                results=tuple(tied),
            )
        except InvalidInputError as exc:
            raise MalformedArchiveError(number, exc.reason) from exc
        data, tokens, kind, calls, results, preview, preview_tokens = entry
        self.count += 1
        self.tokens += tokens
        self.first = self.first or entry_id
        self.last = entry_id
        self.batch += [entry_id, kind, data, tokens, calls, results, preview, preview_tokens]
        self.batch += [self.count, self.tokens]
        # As an append charges it: the data (twice when kept), and the preview.
        self.pending += len(data) * (2 if kind else 1) + len(preview)
        self._check_quotas(self.bytes + self.pending)
        if len(self.batch) >= STAGE_BATCH * 10 or self.pending >= STAGE_BYTES:
            await self._flush()

    def _open_message(self, number: int, record: dict[str, Any]) -> Any:
        if "message" in record:
            return record["message"]
        sealed = self._sealed(number, record, "sealed")
        try:
            return json.loads(sealed)
        except ValueError as exc:
            raise MalformedArchiveError(number, "a sealed message is not JSON") from exc

    def _sealed(self, number: int, record: dict[str, Any], name: str) -> bytes:
        """A sealed value of the line, opened with the keyring (it must hold its key)."""
        value, aad = record.get(name), record.get("aad")
        if not isinstance(value, str) or not isinstance(aad, str):
            raise MalformedArchiveError(number, f"a line needs {name} and aad strings")
        keyring = self.scope.codec.keyring
        if keyring is None:
            raise MalformedArchiveError(
                number, "the value is sealed and this store has no encryption key"
            )
        try:
            return keyring.open(self.tenant, aad, base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError, DecryptionError) as exc:
            raise MalformedArchiveError(number, f"a sealed value does not open: {exc}") from exc

    def _texts(self, number: int, record: dict[str, Any]) -> dict[str, str]:
        """A summary's ledger, narrative and state, in clear (opened if sealed)."""
        out = {}
        for name in ("ledger", "narrative", "state"):
            if name + "_sealed" in record:
                out[name] = self._sealed(number, record, name + "_sealed").decode()
            elif name in record:
                value = record[name]
                if not isinstance(value, str):
                    raise MalformedArchiveError(number, f"{name} must be a string")
                out[name] = value
        if not out.get("ledger"):
            raise MalformedArchiveError(number, "a summary needs its ledger")
        for name, value in out.items():
            # A summary is no larger than a message may be: an archive cannot store
            # megabytes past the quota in the session's summary.
            if len(value.encode()) > self.limits.message_bytes:
                raise MalformedArchiveError(
                    number,
                    f"the summary's {name} is over {self.limits.message_bytes} bytes "
                    "(the largest a message may be)",
                )
        return out

    def _summary_fields(self, number: int, record: dict[str, Any]) -> tuple[list[Any], str, int]:
        """A summary line's (or a checkpoint's) view fields, sealed for the target."""
        covers = self._entry_id(number, record.get("covers"))
        covered = record.get("covered_tokens")
        if not isinstance(covered, int) or covered < 0:
            raise MalformedArchiveError(number, "covered_tokens must be a whole number")
        texts = self._texts(number, record)
        role = self.scope.settings.summary_role
        counter = self.scope.counter
        codec = self.scope.codec
        fields: list[Any] = [
            "l1",
            codec.seal(self.target, texts["ledger"].encode()),
            "n1",
            count_message(counter, summary_message(texts["ledger"], role)),
            "covers",
            covers,
            "model",
            str(record.get("model") or "import"),
        ]
        if texts.get("narrative"):
            both = texts["ledger"] + "\n\n" + texts["narrative"]
            fields += ["l2", codec.seal(self.target, texts["narrative"].encode())]
            fields += ["n2", count_message(counter, summary_message(both, role))]
        if texts.get("state"):
            fields += ["state", codec.seal(self.target, texts["state"].encode())]
        return fields, covers, covered

    def _summary(self, number: int, record: dict[str, Any]) -> None:
        if self.summary:
            raise MalformedArchiveError(number, "a second summary line")
        self.summary, self.summary_covers, self.summary_tokens = self._summary_fields(
            number, record
        )
        self.summary_line = number

    def _checkpoint(self, number: int, record: dict[str, Any]) -> None:
        try:
            name = checkpoint_id(record.get("id"))
        except InvalidInputError as exc:
            raise MalformedArchiveError(number, exc.reason) from exc
        entry = record.get("entry_id")
        if entry != "":
            entry = self._entry_id(number, entry)
        numbers = {k: record.get(k) for k in ("seq", "epoch", "count", "tokens", "created_ms")}
        if not all(isinstance(v, int) and v >= 0 for v in numbers.values()):
            raise MalformedArchiveError(number, "a checkpoint's counters must be whole numbers")
        label = record.get("name")
        if label is not None and not isinstance(label, str):
            raise MalformedArchiveError(number, "a checkpoint's name must be a string")
        covers, covered, fields = "", 0, list[Any]()
        if record.get("summary") is not None:
            if not isinstance(record["summary"], dict):
                raise MalformedArchiveError(number, "a checkpoint's summary must be an object")
            fields, covers, covered = self._summary_fields(number, record["summary"])
        body = {
            "entry_id": entry,
            "seq": str(numbers["seq"]),
            "epoch": str(numbers["epoch"]),
            "count": str(numbers["count"]),
            "tokens": str(numbers["tokens"]),
            "covers": covers,
            "wm_tokens": str(covered),
            "made": str(numbers["created_ms"]),
            "name": label or "",
            "branch": "",
        }
        if any(p[1] == name for p in self.points):
            raise MalformedArchiveError(number, f"checkpoint {name} twice")
        self.points.append((number, name, str(entry), body, fields))
        if self.limits.checkpoints and len(self.points) > self.limits.checkpoints:
            raise QuotaExceededError(
                "checkpoints",
                self.limits.checkpoints,
                len(self.points),
                tenant=self.scope.tenant,
                session=self.target,
            )

    def _entry_id(self, number: int, value: object) -> str:
        try:
            return check_entry_id(value)
        except InvalidInputError as exc:
            raise MalformedArchiveError(number, exc.reason) from exc

    async def _flush(self) -> None:
        if not self.batch:
            return
        added = await self.scope.connection.script(
            SCRIPTS.import_stage, self.stage, (STAGE_MS, *self.batch), session=self.target
        )
        self.bytes += int(added)
        self.batch, self.pending = [], 0
        self.staged = True

    def _check_quotas(self, size: int) -> None:
        """Refuse at once when the messages so far are over a quota.

        The end line would be refused anyway; refusing as soon as it is certain
        keeps an endless input (or one that never ends) from holding memory in
        Redis or here.
        """
        for quota, limit, value in (
            ("session_bytes", self.limits.session_bytes, size),
            ("session_tokens", self.limits.session_tokens, self.tokens),
        ):
            if limit and value > limit:
                raise QuotaExceededError(
                    quota, limit, value, tenant=self.scope.tenant, session=self.target
                )

    async def abandon(self) -> None:
        """Drop what was staged: nothing of the session is written."""
        self.batch = []
        if self.staged:
            await self.scope.connection.transaction(
                [("DEL", *self.stage)], session=self.target, key=self.stage[0]
            )

    async def finish(self, number: int, record: dict[str, Any]) -> ImportResult:
        """Write the session, whole, at its end line."""
        try:
            return await self._finish(number, record)
        except BaseException:
            await self.abandon()
            raise

    async def _finish(self, number: int, record: dict[str, Any]) -> ImportResult:
        if record.get("count") != self.count:
            raise MalformedArchiveError(
                number, f"the end line counts {record.get('count')!r} messages, not {self.count}"
            )
        if record.get("digest") not in (None, self.digest.hexdigest()):
            raise MalformedArchiveError(number, "the session's lines do not match its digest")
        await self._flush()
        keys = self.scope.keys(self.target)
        points: list[Any] = [len(self.points)]
        for _, name, entry, body, fields in self.points:
            points += [name, entry, json.dumps(body), len(fields) // 2, *fields]
        args = (
            secrets.token_urlsafe(9),
            None,  # the reservation: filled in by each run
            None,
            clock_arg(self.scope.clock),
            self.limits.ttl_arg,
            self.scope.period_ms,
            self.limits.session_bytes,
            self.limits.session_tokens,
            self.limits.appends_per_second,
            self.limits.append_burst,
            self.digest.hexdigest(),
            self.count,
            self.tokens,
            self.bytes,
            self.first,
            self.last,
            self.summary_covers,
            self.summary_tokens,
            len(self.summary) // 2,
            *self.summary,
            *points,
        )

        async def run(reservation: tuple[str, int], after: Commands) -> Any:
            return await self.scope.connection.script(
                SCRIPTS.import_commit,
                (
                    *(keys.log, keys.meta, keys.keep, keys.view, keys.gone, keys.idem),
                    *(keys.idem_old, keys.checkpoints, keys.checkpoint_summaries, *self.stage),
                ),
                (args[0], *reservation, *args[3:]),
                session=self.target,
                replicas=self.scope.settings.replica_acks,
                refused=lambda reply: text(reply[0]) not in (Reply.OK, "unchanged"),
                after=after,
            )

        reply = await self.writer.listed(self.target, self.limits, run)
        status = text(reply[0])
        if status == Reply.EXISTS:
            raise SessionExistsError(
                f"an import cannot write over a session that exists (from {self.source})",
                tenant=self.scope.tenant,
                session=self.target,
            )
        if status == Reply.MISSING:
            what = text(reply[1])
            line = (
                self.summary_line
                if what == "summary"
                else next(p[0] for p in self.points if p[1] == what)
            )
            raise MalformedArchiveError(line, f"{what} names an entry the session does not hold")
        if status == Reply.QUOTA:
            raise quota_error(reply, tenant=self.scope.tenant, session=self.target, key=keys.meta)
        if status not in (Reply.OK, "unchanged"):
            raise StoreUnavailableError(
                "the import kept missing its index reservation; nothing was written",
                tenant=self.scope.tenant,
                session=self.target,
            )
        return ImportResult(
            session=self.target,
            status="imported" if status == Reply.OK else "unchanged",
            count=self.count,
            checkpoints=len(self.points),
            source=f"{self.tenant}/{self.source}",
        )


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
