"""Any string as a store session id, and back: the one mapping every adapter uses.

Frameworks hand over a conversation's id as their caller chose it (LangChain's
``RunnableWithMessageHistory`` and LangGraph's ``thread_id`` pass it straight
through): an e-mail address, a path, a name in any script. A store session id
is 1 to 128 ASCII letters, digits, ``_``, ``.`` and ``-`` (see
:mod:`ctxstore._layout.keys` for why), so :func:`encode_session_id` maps every
other string onto one, and :func:`decode_session_id` maps it back:

- A string that is already a session id, and does not start with ``_.``, is
  itself: ``user-123`` is stored as ``user-123``.
- Any other string is ``_.e`` then its UTF-8 bytes, ASCII letters, digits,
  ``_`` and ``-`` as they are and every other byte as ``.`` and two uppercase
  hex digits: ``Ada Lovelace/1`` is ``_.eAda.20Lovelace.2F1``. That fits while
  the id escapes to at most 125 characters (125 ASCII characters, about 41
  bytes of other scripts).
- A string whose escaped form would not fit is ``_.h`` then the hex SHA-256
  of its UTF-8 bytes (67 characters). The id itself is not kept in it, so
  this form cannot be decoded.

No two strings get one id. Ids of the first kind never start with ``_.``; the
other two differ in their third character; an escaped id decodes to the
string it came from (each ``.XX`` is one byte, and no other ``.`` appears), so
two strings with one escaped form are one string; two hashed ids are one only
where SHA-256 collides. The reserved ``_.`` is itself valid (a session id may
start with ``_`` and hold ``.``), so every form is a valid session id, with no
``..``; a raw id that starts with it is escaped like any other, which is what
keeps the first rule from meeting the other two.

Lone surrogates, which Python strings may hold and UTF-8 may not, are encoded
as their three bytes (``surrogatepass``), so every string has an id. An empty
string is refused: it is almost always a missing id, and one session shared by
every caller that forgot theirs would mix their conversations.
"""

from __future__ import annotations

import hashlib
import re

from ctxstore._layout.keys import MAX_ID_LENGTH, validate_id
from ctxstore.errors import InvalidIdError

__all__ = ["ESCAPED", "HASHED", "RESERVED", "decode_session_id", "encode_session_id"]

RESERVED = "_."
"""The prefix of every id that is not the string itself; raw ids starting with it are escaped."""
ESCAPED = RESERVED + "e"
"""The prefix of an id that holds its string, escaped."""
HASHED = RESERVED + "h"
"""The prefix of an id that holds only the SHA-256 of a string too long to escape."""

_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE = re.compile(r"\.([0-9A-F]{2})")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def encode_session_id(value: str) -> str:
    """The store session id for ``value``: itself when it already is one, else its encoding.

    Args:
        value: Any non-empty string.

    Returns:
        A valid session id, different for every ``value`` (see the module's docstring).

    Raises:
        InvalidIdError: ``value`` is not a string, or is empty.
    """
    if not isinstance(value, str):
        raise InvalidIdError(f"session id must be a string, not {type(value).__name__}")
    value = str.__str__(value)  # a str subclass's own methods take no part
    if not value:
        raise InvalidIdError("session id is empty")
    if not value.startswith(RESERVED) and _is_session_id(value):
        return value
    raw = value.encode("utf-8", "surrogatepass")
    escaped = ESCAPED + "".join(chr(byte) if byte in _KEPT else f".{byte:02X}" for byte in raw)
    if len(escaped) <= MAX_ID_LENGTH:
        return escaped
    return HASHED + hashlib.sha256(raw).hexdigest()


def decode_session_id(session: str) -> str:
    """The string :func:`encode_session_id` mapped onto ``session``.

    Args:
        session: A store session id.

    Returns:
        The string whose id ``session`` is.

    Raises:
        InvalidIdError: ``session`` is hashed (the string is not kept in it), or
            :func:`encode_session_id` never returns it.
    """
    if not isinstance(session, str):
        raise InvalidIdError(f"session id must be a string, not {type(session).__name__}")
    if session.startswith(HASHED) and _DIGEST.fullmatch(session, len(HASHED)):
        raise InvalidIdError(
            f"session id {session!r} is the digest of a longer id, which it does not keep"
        )
    if session.startswith(ESCAPED):
        body = session[len(ESCAPED) :]
        raw = bytes(_unescaped(body))
        try:
            value = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            value = None
        if value and encode_session_id(value) == session:  # the one canonical form
            return value
    elif not session.startswith(RESERVED) and _is_session_id(session):
        return session
    raise InvalidIdError(f"{session[:160]!r} is not a session id an adapter makes")


def _is_session_id(value: str) -> bool:
    """True when the store takes ``value`` as a session id as it is."""
    try:
        validate_id(value, "session")
    except InvalidIdError:
        return False
    return True


def _unescaped(body: str) -> list[int]:
    """The bytes an escaped body stands for; a stray ``.`` stands for itself (never canonical)."""
    out: list[int] = []
    index = 0
    while index < len(body):
        escape = _ESCAPE.match(body, index)
        if escape is not None:
            out.append(int(escape.group(1), 16))
            index = escape.end()
        else:
            out.extend(body[index].encode("utf-8", "surrogatepass"))
            index += 1
    return out
