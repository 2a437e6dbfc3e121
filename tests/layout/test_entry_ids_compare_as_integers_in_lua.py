"""The scripts order entry ids as Redis does: two 64-bit integers, never two doubles."""

from __future__ import annotations

import random

from redis.asyncio import Redis

from ctxstore._layout.formats import entry_order
from ctxstore._redis.scripts import _LIB, _used

_PROBE = (
    b"local out = {}\n"
    b"for i = 1, #ARGV, 2 do out[#out + 1] = id_before(ARGV[i], ARGV[i + 1]) and 1 or 0 end\n"
    b"return out\n"
)
"""Calls _lib.lua's id_before on each pair of arguments."""


def pairs() -> list[tuple[str, str]]:
    """Ids where doubles fail (past 2**53, at 2**64 - 1, one digit apart) and ordinary ones."""
    edge = [
        ("9007199254740992-0", "9007199254740993-0"),
        ("9007199254740993-0", "9007199254740993-1"),
        ("5-9007199254740992", "5-9007199254740993"),
        (f"{2**64 - 1}-0", f"{2**64 - 2}-{2**64 - 1}"),
        (f"1-{2**64 - 1}", f"1-{2**64 - 2}"),
        ("1234567890123456-7", "1234567890123457-7"),
        ("123456789012345678-1", "123456789012345678-2"),
        ("9-0", "10-0"),
        ("10-0", "9-0"),
        ("1-10", "1-9"),
        ("0-1", "0-1"),
        ("1714000000000-0", "1714000000000-1"),
    ]
    rng = random.Random(7)
    drawn = []
    for _ in range(300):
        base = rng.choice([2**53, 2**63, 2**64 - 2**20, 10**15, 1_714_000_000_000])
        a = (base + rng.randrange(2**20), rng.randrange(3))
        b = (base + rng.randrange(2**20), rng.randrange(3))
        drawn.append((f"{a[0]}-{a[1]}", f"{b[0]}-{b[1]}"))
    same = [(a, a) for a, _ in edge]
    return [*edge, *((b, a) for a, b in edge), *same, *drawn]


async def test_id_before_orders_ids_as_integer_pairs(raw_redis: Redis) -> None:
    """id_before(a, b) is entry_order(a) < entry_order(b) for ids doubles cannot tell apart."""
    cases = pairs()
    script = (_used(_LIB, _PROBE) + _PROBE).decode()
    flat = [part for pair in cases for part in pair]
    got = await raw_redis.eval(script, 0, *flat)  # type: ignore[misc]
    want = [int(entry_order(a) < entry_order(b)) for a, b in cases]
    wrong = [(a, b) for (a, b), g, w in zip(cases, got, want, strict=True) if g != w]
    assert wrong == []


async def test_the_empty_id_comes_before_every_other(raw_redis: Redis) -> None:
    """'' (before the first entry) is before any id, and not before itself."""
    script = (_used(_LIB, _PROBE) + _PROBE).decode()
    got = await raw_redis.eval(script, 0, "", "0-1", "0-1", "", "", "")  # type: ignore[misc]
    assert got == [1, 0, 0]
