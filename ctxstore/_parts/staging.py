"""An import's staging: one session checked and staged line by line, written at its end.

:class:`StagedSession` takes the lines of one session of an export
(:mod:`ctxstore._parts.archive`) as they come, each already checked by the
archive's schema (:mod:`ctxstore._layout.archive`). Here each is checked
against what came before it and against the store (a sealed value is opened,
for this tenant only, then sealed again for its new session); messages are
staged a batch at a time (``import_stage.lua``) in keys of the target's slot
that nothing reads, and the session appears whole at the end line
(``import_commit.lua``). A refused line drops what was staged: nothing of the
session is written.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import secrets
from typing import Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.archive import (
    CheckpointLine,
    EndLine,
    Line,
    MessageLine,
    SummaryBody,
    SummaryLine,
    load_json,
)
from ctxstore._layout.codec import Reply, summary_message, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.validate import check_label
from ctxstore._parts.checkpoints import stored_name
from ctxstore._parts.scope import Scope
from ctxstore._parts.writes import Writer
from ctxstore._redis.connection import Commands
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.quotas import Limits, quota_error
from ctxstore._tenant.staged import StagedImports
from ctxstore.encryption import MAGIC
from ctxstore.errors import (
    CtxstoreError,
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

__all__ = ["StagedSession"]

STAGE_BATCH = 500
"""Messages an import stages per round trip, at most."""
STAGE_BYTES = 1 << 20
"""Bytes of messages an import stages per round trip, at most (a batch ends at either)."""
STAGE_MS = 3_600_000
"""How long an import's staged batches last if it dies before its end line."""


class StagedSession:
    """One session being imported: checked and staged line by line, written at its end.

    Args:
        scope: The tenant's scope (it is imported into this tenant).
        writer: Validates and serializes messages, and lists the session.
        tenant: The tenant it was exported from (its sealed values open only for it).
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
        self.registry = StagedImports(scope)
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

    async def add(self, number: int, line: Line, encoded: bytes) -> None:
        """Take in one line, checked by the schema (messages are staged a batch at a time).

        Args:
            number: The line's number in the input.
            line: The line, as the schema read it.
            encoded: Its JSON in the digest's form (the session's digest is theirs).
        """
        self.digest.update(encoded + b"\n")
        if isinstance(line, MessageLine):
            await self._message(number, line)
        elif isinstance(line, SummaryLine):
            self._summary(number, line)
        elif isinstance(line, CheckpointLine):
            self._checkpoint(number, line)
        else:
            raise MalformedArchiveError(number, f"a {line.ctxstore} line inside a session")

    async def _message(self, number: int, line: MessageLine) -> None:
        entry_id = line.id
        if self.last and entry_order(entry_id) <= entry_order(self.last):
            raise MalformedArchiveError(number, f"entry {entry_id} does not follow {self.last}")
        message = line.message
        if message is None:
            message = self._json(number, self._sealed(number, line.sealed, line.aad))
        try:
            entry = self.writer.entry(
                self.target,
                message,
                self.limits,
                pinned=line.pinned,
                calls=tuple(line.ties),
                results=tuple(line.tied),
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

    @staticmethod
    def _json(number: int, value: bytes) -> Any:
        """A sealed message, opened: UTF-8 JSON, held to what a line's own is."""
        try:
            return load_json(value.decode())[0]
        except (ValueError, RecursionError) as exc:  # UTF-8's errors are ValueErrors too
            raise MalformedArchiveError(number, "a sealed message is not UTF-8 JSON") from exc

    def _sealed(self, number: int, value: str | None, aad: str | None) -> bytes:
        """A sealed value of the line, opened for this tenant (its keyring must hold the key).

        A sealed value opens only for the tenant that sealed it: its key is that
        tenant's own, and the tenant is bound into its associated data. It is
        opened as this store's tenant, whatever the session line says.
        """
        if value is None or aad is None:  # the schema pairs them: not reached
            raise MalformedArchiveError(number, "a sealed value needs its aad")
        if self.tenant != self.scope.tenant:
            raise MalformedArchiveError(
                number,
                f"the value is sealed for tenant {self.tenant!r} and opens only for it: "
                "export it in clear (clear=True, with the key) to import it elsewhere",
            )
        if self.scope.codec.keyring is None:
            raise MalformedArchiveError(
                number, "the value is sealed and this store has no encryption key"
            )
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MalformedArchiveError(number, f"a sealed value is not base64: {exc}") from exc
        if not raw.startswith(MAGIC):
            raise MalformedArchiveError(number, "a sealed value is not one the store sealed")
        try:
            return self.scope.codec.open(aad, raw)
        except DecryptionError as exc:
            raise MalformedArchiveError(number, f"a sealed value does not open: {exc}") from exc

    def _text(self, number: int, name: str, value: str, sealed: bool, aad: str | None) -> str:
        """One of a summary's texts (or a checkpoint's name), in clear."""
        if not sealed:
            return value
        try:
            return self._sealed(number, value, aad).decode()
        except UnicodeDecodeError as exc:
            raise MalformedArchiveError(number, f"the sealed {name} is not UTF-8") from exc

    def _texts(self, number: int, body: SummaryBody) -> dict[str, str]:
        """A summary's ledger, narrative and state, in clear (opened if sealed)."""
        out = {
            name: self._text(number, name, value, sealed, body.aad)
            for name, (value, sealed) in body.texts().items()
        }
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

    def _summary_fields(self, number: int, body: SummaryBody) -> list[Any]:
        """A summary line's (or a checkpoint's) view fields, sealed for the target."""
        texts = self._texts(number, body)
        role = self.scope.settings.summary_role
        counter = self.scope.counter
        codec = self.scope.codec
        fields: list[Any] = [
            "l1",
            codec.seal(self.target, texts["ledger"].encode()),
            "n1",
            count_message(counter, summary_message(texts["ledger"], role)),
            "covers",
            body.covers,
            "model",
            body.model or "import",
        ]
        if texts.get("narrative"):
            both = texts["ledger"] + "\n\n" + texts["narrative"]
            fields += ["l2", codec.seal(self.target, texts["narrative"].encode())]
            fields += ["n2", count_message(counter, summary_message(both, role))]
        if texts.get("state"):
            fields += ["state", codec.seal(self.target, texts["state"].encode())]
        return fields

    def _summary(self, number: int, line: SummaryLine) -> None:
        if self.summary:
            raise MalformedArchiveError(number, "a second summary line")
        self.summary = self._summary_fields(number, line)
        self.summary_covers, self.summary_tokens = line.covers, line.covered_tokens
        self.summary_line = number

    def _checkpoint(self, number: int, line: CheckpointLine) -> None:
        name = line.name
        if line.name_sealed is not None:
            name = self._text(number, "name", line.name_sealed, True, line.aad)
            try:
                check_label(name, "a checkpoint's name")
            except InvalidInputError as exc:
                raise MalformedArchiveError(number, exc.reason) from exc
        covers, covered, fields = "", 0, list[Any]()
        if line.summary is not None:
            fields = self._summary_fields(number, line.summary)
            covers, covered = line.summary.covers, line.summary.covered_tokens
        body = {
            "entry_id": line.entry_id,
            "seq": str(line.seq),
            "epoch": str(line.epoch),
            "count": str(line.count),
            "tokens": str(line.tokens),
            "covers": covers,
            "wm_tokens": str(covered),
            "made": str(line.created_ms),
            "name": stored_name(self.scope.codec, self.target, name),
            "branch": "",
        }
        if any(p[1] == line.id for p in self.points):
            raise MalformedArchiveError(number, f"checkpoint {line.id} twice")
        self.points.append((number, line.id, line.entry_id, body, fields))
        if self.limits.checkpoints and len(self.points) > self.limits.checkpoints:
            raise QuotaExceededError(
                "checkpoints",
                self.limits.checkpoints,
                len(self.points),
                tenant=self.scope.tenant,
                session=self.target,
            )

    async def _flush(self) -> None:
        if not self.batch:
            return
        # Named first: a pod that dies after the batch leaves keys delete and forget find.
        await self.registry.register(self.target, self.token, STAGE_MS)
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
                [("UNLINK", *self.stage)], session=self.target, key=self.stage[0]
            )
            await self.registry.unregister(self.target, self.token)

    async def finish(self, number: int, line: EndLine) -> ImportResult:
        """Write the session, whole, at its end line."""
        try:
            return await self._finish(number, line)
        except BaseException:
            await self.abandon()
            raise

    async def _finish(self, number: int, line: EndLine) -> ImportResult:
        if line.count != self.count:
            raise MalformedArchiveError(
                number, f"the end line counts {line.count} messages, not {self.count}"
            )
        if line.digest not in (None, self.digest.hexdigest()):
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
            at = (
                self.summary_line
                if what == "summary"
                else next(p[0] for p in self.points if p[1] == what)
            )
            raise MalformedArchiveError(at, f"{what} names an entry the session does not hold")
        if status == Reply.QUOTA:
            raise quota_error(reply, tenant=self.scope.tenant, session=self.target, key=keys.meta)
        if status not in (Reply.OK, "unchanged"):
            raise StoreUnavailableError(
                "the import kept missing its index reservation; nothing was written",
                tenant=self.scope.tenant,
                session=self.target,
            )
        if self.staged:
            # The import landed: a failure to say so here must not report it as failed (an
            # entry left behind names keys that are gone, and goes with the next drop).
            with contextlib.suppress(CtxstoreError):
                await self.registry.unregister(self.target, self.token)
        return ImportResult(
            session=self.target,
            status="imported" if status == Reply.OK else "unchanged",
            count=self.count,
            checkpoints=len(self.points),
            source=f"{self.tenant}/{self.source}",
        )
