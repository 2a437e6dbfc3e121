"""An append's forms on the wire: which one a pod sent, and sending it another way.

append.lua takes a lean form (4 keys, 5 arguments before the messages'), the lean form
carrying the limits, and a full one (12 keys, 13); each message takes 8 arguments, or 3
in the bare form. ``sent`` and ``tap`` record what a store sends; ``leanify`` and ``tap``
rewrite it as another client (or an older pod) would have sent it.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis import exceptions as rex

from ctxstore import ContextStore
from ctxstore._redis.scripts import SCRIPTS, _used
from support.config import REPO
from support.faults import Action, applied

FULL, LEAN, LEAN_LIMITED = (12, 13), (4, 5), (4, 10)
"""An append's form: its keys, and its arguments before the messages' (8 or 3 each).

LEAN_LIMITED: the lean form carrying a default TTL and the quotas (ARGV[5] negative).
"""


def first_of(keys: int, argv: Any) -> int:
    """The arguments before the messages' in an append declaring ``keys`` keys."""
    if keys == FULL[0]:
        return FULL[1]
    return LEAN_LIMITED[1] if int(argv[4]) < 0 else LEAN[1]


def sent(store: ContextStore, per: list[int] | None = None) -> list[tuple[int, int]]:
    """Record the form of each append the store sends (EVALSHA, EVAL or FCALL).

    Each is its keys and its arguments before the messages'; ``per`` gets each
    message's: 8, or 3 in the bare form.
    """
    real = store._connection.node_call
    names = {SCRIPTS.append.sha, SCRIPTS.append.source, SCRIPTS.append.function}
    runs: list[tuple[int, int]] = []

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        for command in commands:
            if command[0] in ("EVALSHA", "EVAL", "FCALL") and command[1] in names:
                keys = int(command[2])
                argv = command[3 + keys :]
                n = abs(int(argv[3]))  # ARGV[4]: the messages
                first = first_of(keys, argv)
                each = (len(argv) - first) // n
                runs.append((keys, first))
                if per is not None:
                    per.append(each)
        return await real(key, commands, **kwargs)

    store._connection.node_call = node_call  # type: ignore[method-assign]
    return runs


def leanify(store: ContextStore, sent: list[bytes]) -> None:
    """Send an append the lean way whenever the script would take it, whatever the clock.

    The machine's pods run on a ManualClock, and a pod with an injected clock always
    sends the full form: this tries the lean form first as the client would (no default
    TTL, quota, reservation or protected message), then the full one on ``{'keys'}``.
    ``sent`` gets the first word of each lean reply.
    """
    real = store._connection.node_call
    names = {SCRIPTS.append.sha, SCRIPTS.append.source, SCRIPTS.append.function}

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        first = commands[0]
        if (
            first[0] in ("EVALSHA", "EVAL", "FCALL")
            and first[1] in names
            and int(first[2]) == FULL[0]
        ):
            keys, argv = first[3 : 3 + FULL[0]], first[3 + FULL[0] :]
            ttl, most_bytes, most_tokens, rate, _burst, reservation = argv[5:11]
            messages = argv[13:]
            bare = len(messages) == 3 * abs(int(argv[3]))  # no kinds: see append.lua
            if (
                ttl == ""
                and not int(most_bytes)
                and not int(most_tokens)
                and not float(rate)
                and reservation == ""
                and (bare or all(kind == "" for kind in messages[3::8]))
            ):
                lean = (first[0], first[1], LEAN[0], *keys[: LEAN[0]], *argv[:5], *messages)
                replies = await real(key, [lean, *commands[1:]], **kwargs)
                reply = replies[0]
                if isinstance(reply, list | bytes):  # applied: one string; refused: a table
                    word = reply.split(b" ", 1)[0] if isinstance(reply, bytes) else reply[0]
                    sent.append(word)
                    if word != b"keys":
                        return replies
        return await real(key, commands, **kwargs)

    store._connection.node_call = node_call  # type: ignore[method-assign]


APPEND = {SCRIPTS.append.sha, SCRIPTS.append.source, SCRIPTS.append.function}


OLD_COMMIT = "1071543"
"""A commit whose append.lua is an older pod's: no layout field in a generation, no bare form."""


@dataclass(frozen=True)
class OldScript:
    """An older pod's append script, as EVALSHA and EVAL take it."""

    sha: str
    source: bytes


def old_append() -> OldScript:
    """append.lua at ``OLD_COMMIT`` behind what it used of that commit's _lib.lua (else skip)."""
    texts = []
    for name in ("_lib.lua", "append.lua"):
        try:
            done = subprocess.run(
                ["git", "show", f"{OLD_COMMIT}:ctxstore/scripts/{name}"],
                cwd=REPO,
                capture_output=True,
                check=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"the older script is not in this checkout: {exc}")
        texts.append(done.stdout)
    lib, body = texts
    assert b"IDEM_TABLE_AT" not in body and b"local PER = 8" in body
    source = _used(lib, body) + body
    return OldScript(hashlib.sha1(source).hexdigest(), source)


def _per(command: tuple[Any, ...]) -> int:
    keys = int(command[2])
    argv = command[3 + keys :]
    return (len(argv) - first_of(keys, argv)) // abs(int(argv[3]))


def _widened(command: tuple[Any, ...]) -> tuple[Any, ...]:
    """The 8-argument form of a bare append (any other is returned as it is)."""
    keys = int(command[2])
    head, argv = command[: 3 + keys], command[3 + keys :]
    first = first_of(keys, argv)
    n = abs(int(argv[3]))
    messages = argv[first:]
    if len(messages) != 3 * n:
        return command
    out = list(argv[:first])
    for i in range(n):
        data, tokens, key = messages[3 * i : 3 * i + 3]
        out += [data, tokens, key, "", "", "", "", 0]
    return (*head, *out)


@dataclass
class Sends:
    """Each append that reached Redis: (keys declared, ARGV[4], arguments a message)."""

    shapes: list[tuple[int, int, int]] = field(default_factory=list)
    lost: int = 0
    names: list[str] = field(default_factory=list)

    @property
    def per(self) -> list[int]:
        return [p for _, _, p in self.shapes]


def tap(
    store: ContextStore,
    monkeypatch: pytest.MonkeyPatch,
    *,
    widen: bool = False,
    old: OldScript | None = None,
    lose: int = 0,
    form: int | None = None,
    between: Action | None = None,
) -> Sends:
    """Watch ``store``'s appends; lose the replies of the first ``lose`` that were applied.

    ``widen``: send each bare append in the 8-argument form. ``old``: run each with the
    older script, 8 arguments a message, as an older pod does. ``form``: lose only
    replies of sends declaring this many keys. ``between``: run after a lost reply.
    """
    real = store._connection.node_call
    sends = Sends()

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        first = commands[0]
        if not (first[0] in ("EVALSHA", "EVAL", "FCALL") and first[1] in APPEND):
            return await real(key, commands, **kwargs)
        if widen or old is not None:
            first = _widened(first)
        if old is not None:
            first = (first[0], old.sha if first[0] == "EVALSHA" else old.source, *first[2:])
        replies = await real(key, [first, *commands[1:]], **kwargs)
        if isinstance(replies[0], rex.NoScriptError):
            return replies
        if old is not None and isinstance(replies[0], list) and replies[0][:1] == [b"ok"]:
            # The older script's reply has no keys' time left (its sixth): as its pod reads it.
            replies = [[*replies[0][:5], b"", *replies[0][5:]], *replies[1:]]
        keys = int(first[2])
        sends.shapes.append((keys, int(first[3 + keys + 3]), _per(first)))
        sends.names.append(first[1] if isinstance(first[1], str) else "source")
        if sends.lost < lose and (form is None or keys == form) and applied(replies[0]):
            sends.lost += 1
            if between is not None:
                await between()
            raise rex.ConnectionError("the reply was lost after Redis applied the script")
        return replies

    monkeypatch.setattr(store._connection, "node_call", node_call)
    return sends


def force_full(pod: ContextStore, session: str) -> None:
    """Make the pod's memo say the lean form will not do: the next append goes full at once."""
    pod._writer._lean_until.put(session, time.monotonic() - 1)
