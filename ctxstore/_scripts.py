"""The Lua scripts, loaded once from package data.

Each file is headed by its KEYS/ARGV contract and the race it closes; the
functions they share are in ``_lib.lua``, put in front of each script's text.
``Connection.script`` runs them with ``EVALSHA`` and, on ``NOSCRIPT`` (a new
or restarted server), sends them once with ``EVAL``, which caches them too.
No ``SCRIPT`` command is ever needed, so ACL users can be denied them all.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

__all__ = ["SCRIPTS", "Script"]


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script.

    Attributes:
        name: Its file name, without ``.lua``.
        source: Its text.
        sha: Its SHA1, as ``EVALSHA`` wants it.
    """

    name: str
    source: bytes
    sha: str

    @classmethod
    def load(cls, name: str) -> Script:
        """Read ``scripts/<name>.lua`` from the package, behind ``scripts/_lib.lua``."""
        scripts = files("ctxstore").joinpath("scripts")
        source = b"".join(scripts.joinpath(f).read_bytes() for f in ("_lib.lua", f"{name}.lua"))
        return cls(name, source, hashlib.sha1(source).hexdigest())


class _Scripts:
    """Every script, loaded once, by attribute."""

    def __init__(self) -> None:
        for name in (
            "append",
            "index_prune",
            "lease_acquire",
            "lease_release",
            "lease_renew",
            "pin",
            "rewrite",
            "session_reserve",
            "set_ttl",
            "summary_commit",
            "summary_request",
        ):
            setattr(self, name, Script.load(name))

    append: Script
    index_prune: Script
    lease_acquire: Script
    lease_release: Script
    lease_renew: Script
    pin: Script
    rewrite: Script
    session_reserve: Script
    set_ttl: Script
    summary_commit: Script
    summary_request: Script


SCRIPTS = _Scripts()
