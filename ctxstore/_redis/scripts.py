"""The Lua scripts, loaded once from package data, and the same as a Redis Functions library.

Each file is headed by its KEYS/ARGV contract and the race it closes; the
functions they share are in ``_lib.lua``. A script's source is the part of
``_lib.lua`` it uses, then its own text: Redis runs the whole source on every
call, so each shared function it carries but never calls is work for nothing.
They run in one of two ways (``Settings.script_mode`` chooses; ``auto``, the
default, takes the second where the library is loaded, else the first):

- ``eval``: ``Connection.script`` runs them with ``EVALSHA`` and, on
  ``NOSCRIPT`` (a new or restarted server), sends them once with ``EVAL``,
  which caches them too. No ``SCRIPT`` command is ever needed.
- ``functions``: an operator loads :func:`library` once per primary
  (``ctxstore functions load``), and the SDK calls each script with
  ``FCALL``, which costs Redis less per call. A Redis user then needs no
  ``EVAL``: a tenant's own user may run the project's scripts and no script
  of its own, so it cannot block the server with an endless one. The
  library's name carries a hash of every script, so two SDK versions can run
  side by side during a rollout.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files

__all__ = ["LIBRARY_NAME", "NAMES", "SCRIPTS", "Script", "library"]

NAMES = (
    "anchor",
    "append",
    "checkpoint",
    "checkpoint_delete",
    "delete",
    "enqueue",
    "fork",
    "freeze",
    "import_commit",
    "import_stage",
    "lease_acquire",
    "lease_release",
    "lease_renew",
    "pin",
    "pop",
    "ratio",
    "read",
    "reserve",
    "rewind",
    "rewrite",
    "search_index",
    "segment_hold",
    "segment_release",
    "set_ttl",
    "summary_commit",
    "summary_request",
    "unlist",
)
"""Every script, by file name (without ``.lua``)."""

FLAGS = {
    "read": "no-writes",
    "delete": "allow-oom",
    "checkpoint_delete": "allow-oom",
    "unlist": "allow-oom",
}
"""The scripts registered with a flag in the library, each one Redis runs when it is full
(past ``maxmemory``, ``noeviction``), where it refuses any other function whole: the reads,
and what makes room. (By ``EVALSHA`` a script runs there until its first write that would
add memory.)"""


def _read(name: str) -> bytes:
    return files("ctxstore").joinpath("scripts").joinpath(name).read_bytes()


_LIB = _read("_lib.lua")
_DEFINITION = re.compile(rb"^local (?:function )?(\w+)", re.MULTILINE)


def _definitions(lib: bytes) -> list[tuple[bytes, bytes]]:
    """``lib``'s top-level definitions, in order, as (name, text with its heading comment).

    A definition starts at a line ``local function name`` or ``local name =`` and
    owns the comment lines just above it; the file's own heading comes before the
    first one and is dropped.
    """
    starts = []
    for match in _DEFINITION.finditer(lib):
        start = match.start()
        while True:  # take in the comment block right above
            above = lib.rfind(b"\n", 0, max(start - 1, 0)) + 1
            if start == 0 or not lib[above:start].startswith(b"--"):
                break
            start = above
        starts.append((match.group(1), start))
    ends = [start for _, start in starts[1:]] + [len(lib)]
    return [(name, lib[start:end]) for (name, start), end in zip(starts, ends, strict=True)]


_COMMENT = re.compile(rb"--[^\n]*")
"""A Lua comment (no script writes ``--`` inside a string: a test checks)."""


def _used(lib: bytes, body: bytes) -> bytes:
    """The definitions of ``lib`` that ``body`` calls, directly or through another one.

    Names are looked for in the code alone: a function a comment mentions is not
    carried (each one carried is a closure made on every call).
    """
    definitions = _definitions(lib)
    needed: set[bytes] = set()
    text = _COMMENT.sub(b"", body)
    while True:
        found = {
            name
            for name, _ in definitions
            if name not in needed and re.search(rb"\b" + name + rb"\b", text)
        }
        if not found:
            break
        needed |= found
        text = _COMMENT.sub(b"", b"".join(part for name, part in definitions if name in found))
    return b"".join(part for name, part in definitions if name in needed)


_BODIES = {name: _read(f"{name}.lua") for name in NAMES}
LIBRARY_NAME = "ctxstore_" + hashlib.sha1(_LIB + b"".join(_BODIES.values())).hexdigest()[:12]
"""The Redis Functions library of this version of the scripts."""


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script.

    Attributes:
        name: Its file name, without ``.lua``.
        source: Its text (what it uses of ``_lib.lua``, then its own).
        sha: Its SHA1, as ``EVALSHA`` wants it.
        function: Its name in the Functions library, as ``FCALL`` wants it.
    """

    name: str
    source: bytes
    sha: str
    function: str

    @classmethod
    def load(cls, name: str) -> Script:
        """The script ``scripts/<name>.lua`` of the package, behind what it uses of ``_lib.lua``."""
        source = _used(_LIB, _BODIES[name]) + _BODIES[name]
        return cls(name, source, hashlib.sha1(source).hexdigest(), f"{LIBRARY_NAME}_{name}")


def library() -> str:
    """The Redis Functions library holding every script (``FUNCTION LOAD`` it).

    ``_lib.lua`` once, then each script as a function of ``KEYS`` and
    ``ARGV``, registered under its :attr:`Script.function` name.
    """
    parts = [f"#!lua name={LIBRARY_NAME}\n", _LIB.decode()]
    for name, body in _BODIES.items():
        parts.append(f"\nlocal function script_{name}(KEYS, ARGV)\n{body.decode()}\nend\n")
        if name in FLAGS:
            parts.append(
                f"redis.register_function{{function_name='{LIBRARY_NAME}_{name}', "
                f"callback=script_{name}, flags={{'{FLAGS[name]}'}}}}\n"
            )
        else:
            parts.append(f"redis.register_function('{LIBRARY_NAME}_{name}', script_{name})\n")
    return "".join(parts)


class _Scripts:
    """Every script, loaded once, by attribute."""

    def __init__(self) -> None:
        for name in NAMES:
            setattr(self, name, Script.load(name))

    anchor: Script
    append: Script
    checkpoint: Script
    checkpoint_delete: Script
    delete: Script
    enqueue: Script
    fork: Script
    freeze: Script
    import_commit: Script
    import_stage: Script
    lease_acquire: Script
    lease_release: Script
    lease_renew: Script
    pin: Script
    pop: Script
    ratio: Script
    read: Script
    reserve: Script
    rewind: Script
    rewrite: Script
    search_index: Script
    segment_hold: Script
    segment_release: Script
    set_ttl: Script
    summary_commit: Script
    summary_request: Script
    unlist: Script


SCRIPTS = _Scripts()
