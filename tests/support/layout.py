"""How Redis keeps a hash: its encoding, and the field that keeps a session's meta a hashtable."""

from __future__ import annotations

from redis.asyncio import Redis

LAYOUT = b"layout"


async def encoding(raw: Redis, key: str) -> str:
    """The key's encoding, as ``OBJECT ENCODING`` names it."""
    found = await raw.object("encoding", key)
    return found.decode() if isinstance(found, bytes) else str(found)
