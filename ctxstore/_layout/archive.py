"""The lines of an export, as one strict schema: what an import takes.

Every line an import reads is parsed here (:func:`parse_line`) before anything
of it is staged: as UTF-8 JSON, then against the models below, in pydantic's
strict mode, with no field unknown to them. A line
that does not fit is refused with its number (``MalformedArchiveError``).
What the schema holds, so that whatever it lets in reads, views, checkpoints
and exports like a session the store wrote itself:

- numbers are integers (never a boolean, a float or a string), from 0 to
  2**63 - 1, the largest Redis takes; a time in ms is at most the last of year
  9999 (what a date can show);
- entry ids are as Redis writes them: ``<ms>-<seq>``, each part a 64-bit
  unsigned number with no leading zero (``0001-0`` names the entry ``1-0``,
  and would be kept twice under the two spellings), never ``0-0``;
- text is UTF-8: a lone surrogate (raw in the line, or escaped in its JSON)
  can be neither stored nor sent, and is refused, as ``NaN`` is;
- the ids that tie a reasoning item to the item after it are spelled as the
  store makes them (``~reasoning:`` and URL-safe base64), one at most each
  way; tenant and session ids, model and checkpoint names are what the store
  accepts from a caller;
- a checkpoint id is ``cp-1`` to ``cp-999999999999``: a session numbers its
  next checkpoints after the highest it holds, and the store takes at most 13
  digits, so an imported session keeps room for every checkpoint it may make.

What needs the store (a sealed value's key, the tenant's quotas, that a line
follows the one before) is checked by the import itself
(:mod:`ctxstore._parts.staging`).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from ctxstore._layout.formats import REASONING_TIE
from ctxstore._layout.keys import validate_id
from ctxstore._layout.validate import INT64, check_entry_id, check_label
from ctxstore.errors import InvalidInputError, MalformedArchiveError

__all__ = [
    "FORMAT_VERSION",
    "MAX_CHECKPOINT",
    "MAX_TIME_MS",
    "CheckpointLine",
    "EndLine",
    "Line",
    "MessageLine",
    "SessionLine",
    "SummaryBody",
    "SummaryLine",
    "load_json",
    "parse_line",
]

FORMAT_VERSION = 1
"""The version of the lines written; an import refuses a newer one."""
MAX_CHECKPOINT = 10**12 - 1
"""The highest checkpoint number an import takes (the store's own go to 13 digits)."""
MAX_TIME_MS = 253_402_300_799_999
"""The last ms of year 9999: the latest time a line may carry."""
_LAST_ID = f"{2**64 - 1}-{2**64 - 1}"
"""After this id no entry fits: an import refuses it, as Redis refuses ``0-0``."""


def _entry_id(value: str) -> str:
    try:
        check_entry_id(value)
    except InvalidInputError as exc:
        raise ValueError(exc.reason) from None
    if value in ("0-0", _LAST_ID):
        raise ValueError(f"{value} cannot be a stream entry's id")
    return value


def _id(kind: str) -> AfterValidator:
    def check(value: str) -> str:
        try:
            return validate_id(value, kind)
        except InvalidInputError as exc:
            raise ValueError(exc.reason) from None

    return AfterValidator(check)


def _label(value: str) -> str:
    try:
        return check_label(value, "a name")
    except InvalidInputError as exc:
        raise ValueError(exc.reason) from None


def _or_empty(check: Any) -> AfterValidator:
    """``check``, or the empty string (what a line writes for none)."""
    return AfterValidator(lambda value: value if value == "" else check(value))


Count = Annotated[StrictInt, Field(ge=0, le=INT64)]
TimeMs = Annotated[StrictInt, Field(ge=0, le=MAX_TIME_MS)]
EntryId = Annotated[StrictStr, AfterValidator(_entry_id)]
TenantId = Annotated[StrictStr, _id("tenant")]
SessionId = Annotated[StrictStr, _id("session")]
EntryIdOrNone = Annotated[StrictStr, _or_empty(_entry_id)]
Label = Annotated[StrictStr, AfterValidator(_label)]
LabelOrNone = Annotated[StrictStr, _or_empty(_label)]
Tie = Annotated[StrictStr, Field(pattern=f"^{re.escape(REASONING_TIE)}[A-Za-z0-9_-]{{1,64}}$")]
"""A reasoning tie as the writer makes one: its prefix, then URL-safe base64."""
Sealed = Annotated[StrictStr, Field(min_length=1, pattern=r"^[A-Za-z0-9+/]+={0,2}$")]
CheckpointId = Annotated[StrictStr, Field(pattern=r"^cp-[1-9][0-9]{0,11}$")]
Digest = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, defer_build=True)
"""Built at the first import's first line, not when a store is made (some 20 ms)."""


class SessionLine(BaseModel):
    """A session's first line: where it comes from (its counts are the store's to recount)."""

    model_config = _STRICT
    ctxstore: Literal["session"]
    version: Annotated[StrictInt, Field(ge=1, le=FORMAT_VERSION)]
    tenant: TenantId
    session: SessionId
    count: Count = 0
    tokens: Count = 0
    epoch: Count = 0
    ttl_seconds: Count | None = None
    exported_at_ms: TimeMs | None = None


class MessageLine(BaseModel):
    """One message, in clear (``message``) or sealed (``sealed``, bound to session ``aad``)."""

    model_config = _STRICT
    ctxstore: Literal["message"]
    id: EntryId
    tokens: Count | None = None
    message: dict[str, Any] | None = None
    sealed: Sealed | None = None
    aad: SessionId | None = None
    ties: Annotated[list[Tie], Field(max_length=1)] = []
    tied: Annotated[list[Tie], Field(max_length=1)] = []
    pinned: StrictBool = False

    @model_validator(mode="after")
    def _one_form(self) -> MessageLine:
        if (self.message is None) == (self.sealed is None):
            raise ValueError("a message line holds message or sealed, one of them")
        if (self.sealed is None) != (self.aad is None):
            raise ValueError("aad goes with sealed, and only with it")
        return self


_TEXTS = ("ledger", "narrative", "state")


class SummaryBody(BaseModel):
    """A summary: what it covers, and its texts, each in clear or sealed (``<text>_sealed``)."""

    model_config = _STRICT
    covers: EntryId
    covered_tokens: Count
    model: LabelOrNone = ""
    ledger: StrictStr | None = None
    narrative: StrictStr | None = None
    state: StrictStr | None = None
    ledger_sealed: Sealed | None = None
    narrative_sealed: Sealed | None = None
    state_sealed: Sealed | None = None
    aad: SessionId | None = None

    @model_validator(mode="after")
    def _texts(self) -> SummaryBody:
        sealed = False
        for name in _TEXTS:
            clear, closed = getattr(self, name), getattr(self, name + "_sealed")
            if clear is not None and closed is not None:
                raise ValueError(f"{name} is given twice, in clear and sealed")
            sealed = sealed or closed is not None
        if not self.ledger and self.ledger_sealed is None:
            raise ValueError("a summary needs its ledger")
        if sealed != (self.aad is not None):
            raise ValueError("aad goes with a sealed text, and only with one")
        return self

    def texts(self) -> dict[str, tuple[str, bool]]:
        """Each text given, by name: its value and whether it is sealed (base64)."""
        out = {}
        for name in _TEXTS:
            clear, closed = getattr(self, name), getattr(self, name + "_sealed")
            if closed is not None:
                out[name] = (closed, True)
            elif clear is not None:
                out[name] = (clear, False)
        return out


class SummaryLine(SummaryBody):
    """The summary in force."""

    ctxstore: Literal["summary"]


class CheckpointLine(BaseModel):
    """A checkpoint; its name in clear (``name``) or sealed (``name_sealed``, with ``aad``)."""

    model_config = _STRICT
    ctxstore: Literal["checkpoint"]
    id: CheckpointId
    name: Label | None = None
    name_sealed: Sealed | None = None
    aad: SessionId | None = None
    entry_id: EntryIdOrNone
    seq: Count
    epoch: Count
    count: Count
    tokens: Count
    created_ms: TimeMs
    summary: SummaryBody | None = None

    @model_validator(mode="after")
    def _one_name(self) -> CheckpointLine:
        if self.name is not None and self.name_sealed is not None:
            raise ValueError("a checkpoint's name is given twice, in clear and sealed")
        if (self.name_sealed is None) != (self.aad is None):
            raise ValueError("aad goes with name_sealed, and only with it")
        return self


class EndLine(BaseModel):
    """A session's last line: how many messages it holds, and their lines' digest."""

    model_config = _STRICT
    ctxstore: Literal["end"]
    session: SessionId | None = None
    count: Count
    digest: Digest | None = None


Line = Annotated[
    SessionLine | MessageLine | SummaryLine | CheckpointLine | EndLine,
    Field(discriminator="ctxstore"),
]
"""Any line of an export, told apart by its ``ctxstore`` field."""


@cache
def _adapter() -> TypeAdapter[Line]:
    return TypeAdapter(Line)


_KINDS = frozenset({"session", "message", "summary", "checkpoint", "end"})


def parse_line(number: int, raw: str) -> tuple[Line, bytes]:
    """One line of an export, checked: what it holds, and its JSON in the digest's form.

    The digest's form (compact, UTF-8) is what the session's digest is made of.

    Args:
        number: The line's number in the input, from 1 (for the error).
        raw: The line's text.

    Raises:
        MalformedArchiveError: It is not UTF-8 JSON text, not an object, or
            does not fit the schema.
    """
    try:
        raw.encode()
    except UnicodeEncodeError:
        raise MalformedArchiveError(
            number, "not UTF-8 text (undecodable bytes, or a lone surrogate)"
        ) from None
    try:
        record, encoded = load_json(raw)
    except json.JSONDecodeError as exc:
        raise MalformedArchiveError(number, f"not JSON: {exc.msg} at column {exc.colno}") from None
    except UnicodeEncodeError:
        raise MalformedArchiveError(number, "its text holds a lone surrogate") from None
    except RecursionError:
        raise MalformedArchiveError(number, "nested too deep to be a line of an export") from None
    except ValueError as exc:  # NaN or Infinity, an integer of thousands of digits
        raise MalformedArchiveError(number, f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise MalformedArchiveError(number, "not a JSON object")
    kind = record.get("ctxstore")
    if not isinstance(kind, str) or kind not in _KINDS:
        shown = repr(kind[:64]) if isinstance(kind, str) else f"of type {type(kind).__name__}"
        raise MalformedArchiveError(number, f"unknown line kind {shown} (its ctxstore field)")
    try:
        return _adapter().validate_python(record), encoded
    except ValidationError as exc:
        raise MalformedArchiveError(number, _describe(exc)) from None
    except RecursionError:
        raise MalformedArchiveError(number, "nested too deep to be a line of an export") from None


def load_json(text: str) -> tuple[Any, bytes]:
    """``text`` parsed as JSON, held to what a line may hold; and its compact UTF-8 form.

    Raises:
        ValueError: It is not JSON (``json.JSONDecodeError``), holds ``NaN`` or
            ``Infinity``, an integer of thousands of digits, or text with a lone
            surrogate (``UnicodeEncodeError``).
        RecursionError: It is nested deeper than Python's parser goes.
    """
    value = json.loads(text, parse_constant=_no_constant)
    # Text with a lone surrogate (raw, or escaped in the JSON) is no text: it cannot
    # be encoded, so it could be neither stored nor sent.
    return value, json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _describe(exc: ValidationError) -> str:
    """The schema's first complaints, by field (never echoing the value: it may be huge)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    parts = []
    for error in errors[:2]:
        where = ".".join(str(part) for part in error["loc"][1:])  # [0] is the line kind
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
