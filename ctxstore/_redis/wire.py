"""The wire: commands packed into one buffer, and their replies read back raw.

A call's commands go out as one write and its replies are read as Redis sent
them (an error reply as its exception object, no redis-py callbacks): the
read path parses only what it uses. Both go by hiredis when it is installed
and redis-py's internals are as read here, and redis-py's way otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from redis import exceptions as rex
from redis._parsers import hiredis as _hiredis_parser

from ctxstore._redis.pool import hiredis  # None where it is not installed

__all__ = ["pack", "read_replies"]


_HIREDIS_PARSER = _hiredis_parser._AsyncHiredisParser
_NOT_ENOUGH_DATA = getattr(_hiredis_parser, "NOT_ENOUGH_DATA", False)
"""What redis-py's hiredis reader answers for a reply not whole yet (``False`` in old ones)."""


def _hiredis_reader(conn: Any) -> tuple[Any, asyncio.StreamReader, int] | None:
    """``conn``'s hiredis reader, stream and read size, if its replies may be read past redis-py.

    Only on RESP2, which never sends a frame unasked (on RESP3 the server may
    push one between replies, which redis-py's own reading skips), with no
    socket timeout, and with redis-py's internals as read here.
    """
    parser = getattr(conn, "_parser", None)
    if (
        type(parser) is not _HIREDIS_PARSER
        or not getattr(parser, "_connected", False)
        or getattr(conn, "protocol", None) not in (2, "2")
        or conn.socket_timeout
    ):
        return None
    reader, stream = getattr(parser, "_reader", None), getattr(parser, "_stream", None)
    if reader is None or not isinstance(stream, asyncio.StreamReader):
        return None
    return reader, stream, getattr(parser, "_read_size", 65536)


async def read_replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn``, raw; an error reply as its exception object.

    Straight from hiredis's reader where :func:`_hiredis_reader` allows it:
    redis-py's ``read_response`` costs some 4 us a reply around it (a warm view
    reads three). A reply that redis-py raises as a connection error
    (``LOADING``, a protocol error) is raised here too.
    """
    replies: list[Any] = []
    lean = _hiredis_reader(conn)
    if lean is None:
        for _ in range(n):
            try:
                replies.append(await conn.read_response(disable_decoding=True))
            except rex.ResponseError as exc:
                replies.append(exc)
        return replies
    reader, stream, size = lean
    while len(replies) < n:
        reply = reader.gets(False)
        if reply is _NOT_ENOUGH_DATA:  # not a whole reply yet
            try:
                data = await stream.read(size)
            except OSError as exc:  # as redis-py says it: a connection error, retried
                raise rex.ConnectionError(f"error while reading from Redis: {exc!r}") from exc
            if not data:
                raise rex.ConnectionError("the server closed the connection")
            reader.feed(data)
            continue
        if isinstance(reply, rex.ConnectionError):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], rex.ConnectionError):
            raise reply[0]
        replies.append(reply)
    return replies


def pack(conn: Any, commands: Sequence[tuple[Any, ...]]) -> bytes | list[bytes]:
    """The commands as one RESP buffer (hiredis when installed, else redis-py's packer)."""
    if hiredis is not None:
        return b"".join(hiredis.pack_command(tuple(c)) for c in commands)
    return cast(list[bytes], conn.pack_commands(commands))
