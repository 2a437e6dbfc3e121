"""Checks of what callers pass in, before anything is formatted or sent.

Every public method validates its arguments here, so a bad value is refused
with an :class:`~ctxstore.errors.InvalidInputError` that names the argument,
and nothing is written. Booleans are never taken for numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ctxstore.errors import InvalidInputError

__all__ = [
    "INT64",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_TTL_SECONDS",
    "check_entry_id",
    "check_idempotency_keys",
    "check_int",
    "check_label",
    "check_messages",
    "check_model",
    "check_numbered_id",
    "check_seconds",
    "check_usage",
    "encodable",
]

INT64 = 2**63 - 1
"""The largest integer Redis takes."""
MAX_TTL_SECONDS = 100 * 365 * 86_400
"""A century, in seconds: the longest TTL (PEXPIRE takes it in ms)."""
MAX_IDEMPOTENCY_KEY = 200
"""The longest idempotency key, in characters."""


def check_int(
    value: object,
    name: str,
    *,
    low: int,
    high: int = INT64,
    optional: bool = False,
    session: str | None = None,
) -> Any:
    """Return ``value`` if it is an integer in ``[low, high]`` (or ``None`` when optional).

    Raises:
        InvalidInputError: Anything else, a boolean included.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        either = "None or " if optional else ""
        raise InvalidInputError(
            f"{name} must be {either}an integer from {low:,} to {high:,}", session=session
        )
    return value


def check_seconds(value: object, name: str, *, low: float, high: float) -> float:
    """A finite number of seconds within ``[low, high]``.

    Raises:
        InvalidInputError: Anything else.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidInputError(f"{name} must be a number of seconds from {low:g} to {high:g}")
    return float(value)


def check_entry_id(entry_id: object, session: str | None = None) -> str:
    """Return ``entry_id`` if it is a stream entry id as Redis spells it (``ms-seq``).

    Each part is an unsigned 64-bit number with no leading zero: Redis reads
    ``0001-0`` as ``1-0``, and an id kept under two spellings (a pin's copy, a
    checkpoint) would name one entry twice.

    Raises:
        InvalidInputError: It is not a string of that form.
    """
    if not isinstance(entry_id, str):
        raise InvalidInputError("an entry id must be a string", session=session)
    ms, dash, seq = entry_id.partition("-")
    if not (
        _DIGITS.fullmatch(ms)
        and dash
        and _DIGITS.fullmatch(seq)
        and int(ms) <= _U64
        and int(seq) <= _U64
    ):
        raise InvalidInputError(f"{entry_id[:64]!r} is not a stream entry id", session=session)
    return entry_id


_DIGITS = re.compile(r"0|[1-9][0-9]{0,19}")
_U64 = 2**64 - 1
"""Each part of a stream entry id is an unsigned 64-bit number, in ASCII digits."""


def check_messages(messages: object, session: str) -> None:
    """Refuse anything but a sequence of messages (a dict or a string is one message).

    Raises:
        InvalidInputError: ``messages`` is not a list or tuple of messages.
    """
    if not isinstance(messages, list | tuple) and (
        isinstance(messages, dict | str) or not isinstance(messages, Sequence)
    ):
        raise InvalidInputError("messages must be a list of dicts", session=session)


def check_idempotency_keys(given: object, count: int, session: str) -> list[str]:
    """Return ``given`` if it is ``count`` distinct, sendable keys.

    Raises:
        InvalidInputError: Not a list of ``count`` strings of 1 to 200
            characters, all different.
    """
    if not isinstance(given, list | tuple) or len(given) != count:
        raise InvalidInputError(
            f"idempotency_keys must be a list of {count} strings", session=session
        )
    for key in given:
        if (
            not isinstance(key, str)
            or not 0 < len(key) <= MAX_IDEMPOTENCY_KEY
            or not encodable(key)
        ):
            raise InvalidInputError(
                f"an idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} characters", session=session
            )
    if len(set(given)) != count:
        raise InvalidInputError("idempotency keys must differ within a batch", session=session)
    return list(given)


def encodable(text: str) -> bool:
    """True when ``text`` is valid UTF-8 (no lone surrogates): what Redis can be sent."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_label(value: object, name: str, *, session: str | None = None) -> str:
    """Return ``value`` if it is 1 to 200 printable characters (a model's or a checkpoint's name).

    Raises:
        InvalidInputError: Anything else.
    """
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= 200
        or not value.isprintable()
        or not encodable(value)
    ):
        raise InvalidInputError(f"{name} must be 1 to 200 printable characters", session=session)
    return value


def check_model(model: object) -> str:
    """Return ``model`` if it can name a model (1 to 200 printable characters).

    Raises:
        InvalidInputError: Anything else.
    """
    return check_label(model, "model (a model's name)")


def check_numbered_id(value: object, prefix: str, what: str, session: str | None = None) -> str:
    """Return ``value`` if it is ``<prefix>-<number>`` (a checkpoint's ``cp-3``, a branch's).

    Raises:
        InvalidInputError: Anything else.
    """
    # At most 13 digits: the scripts count them in Lua numbers, which print the next one
    # in exponent form from 1e14 on ("cp-1e+14").
    if not isinstance(value, str) or re.fullmatch(prefix + r"-[1-9][0-9]{0,12}", value) is None:
        shown = repr(value[:64]) if isinstance(value, str) else type(value).__name__
        raise InvalidInputError(
            f"a {what} id is {prefix}-<number> (e.g. {prefix}-1), not {shown}", session=session
        )
    return value


def check_usage(view: Any, input_tokens: object, overhead_tokens: object, model: object) -> int:
    """Check a usage report; return the tokens the store counted for the view.

    Raises:
        InvalidInputError: Not a view, counts that are not whole numbers, an
            overhead of all the input, or a bad model name.
    """
    from ctxstore.models import RequestView

    if not isinstance(view, RequestView):
        raise InvalidInputError("view must be the RequestView that was sent")
    total = check_int(input_tokens, "input_tokens", low=1)
    if check_int(overhead_tokens, "overhead_tokens", low=0) >= total:
        raise InvalidInputError("overhead_tokens must be less than input_tokens")
    check_model(model)
    if view.stats.tokens <= 0:
        raise InvalidInputError("the view sent nothing to learn from")
    return view.stats.tokens
