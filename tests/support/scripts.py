"""What a pod's scripts did, as MONITOR saw it: how each was sent and the keys it touched."""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis

from ctxstore import Settings
from support.servers import Logged

# The commands scripts run that name no key (COMMAND GETKEYS refuses them). Any other
# command must name keys: a failing GETKEYS fails the test rather than pass unchecked.
KEYLESS = {b"TIME"}


@dataclass
class Call:
    """One script call seen by MONITOR, and the commands it ran."""

    sha_or_body: bytes
    declared: list[bytes]
    inner: list[tuple[bytes, ...]] = field(default_factory=list)


def script_calls(logged: list[Logged]) -> list[Call]:
    """Group MONITOR entries into script calls and the commands each ran."""
    calls: list[Call] = []
    for entry in logged:
        if entry.source == "lua":
            assert calls, f"a script's command before any script call: {entry}"
            calls[-1].inner.append(entry.args)
            continue
        if entry.args[0].lower() in (b"eval", b"evalsha"):
            count = int(entry.args[2])
            calls.append(Call(entry.args[1], list(entry.args[3 : 3 + count])))
    return calls


async def undeclared(
    admin: Redis, calls: list[Call]
) -> tuple[list[tuple[bytes, tuple[bytes, ...], bytes]], int]:
    """(script, command, key) for every key touched without being declared; keys checked."""
    found = []
    checked = 0
    for call in calls:
        for command in call.inner:
            if command[0].upper() in KEYLESS:
                continue
            keys = await admin.command_getkeys(*command)
            assert keys, f"no keys in {command[:2]}: add it to KEYLESS if that is right"
            for named in keys:  # redis-py answers them as str
                checked += 1
                key = named.encode() if isinstance(named, str) else named
                if key not in call.declared:
                    found.append((call.sha_or_body[:16], command[:2], key))
    return found, checked


def settings_for(url: str, **changes: object) -> Settings:
    """The default script mode on ``url``, under the test's own prefix."""
    return Settings(redis_url=url, key_prefix="auto", queue_name="auto:summaries", **changes)


def by(logged: list[Logged]) -> list[bytes]:
    """How each script call was sent, in order: b'fcall', b'evalsha' or b'eval'."""
    return [
        e.args[0].lower()
        for e in logged
        if e.source != "lua" and e.args[0].lower() in (b"fcall", b"evalsha", b"eval")
    ]
