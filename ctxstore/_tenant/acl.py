"""Least-privilege Redis ACL users for ctxstore (Redis 7 ACL syntax).

``ctxstore acl`` renders them as an ACL file. Three kinds of user:

- ``ctxstore-pod``: the agent pods' service user. Every tenant's keys, the
  summary queue (to enqueue jobs), and only the commands the SDK sends.
- ``ctxstore-worker``: the summary workers. As the pods, plus what an arq
  worker needs on the queue's keys.
- ``ctxstore-t-<tenant>``: optional, one per tenant, for pods that serve a
  single tenant: that tenant's keys only (its limits read-only), no queue
  (its summaries are queued by the workers' sweep, which finds the tenant by
  the user's name), no key shared with other tenants, and no script of its
  own: it runs the project's scripts as Redis Functions (``FCALL``, as the
  default ``script_mode``, auto, does once ``ctxstore functions load`` loaded
  them), so it cannot block the server for every tenant with an endless ``EVAL``.

None of them may run ``KEYS``, ``SCAN``, ``RANDOMKEY``, ``DBSIZE``, ``INFO``,
``FUNCTION``, any ``SCRIPT`` subcommand, ``FLUSHALL``/``FLUSHDB``, ``CONFIG``,
or pub/sub. Scripts run with the caller's permissions, so the commands the
scripts call are listed too. Passwords are stored as SHA-256 hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ctxstore._layout.keys import (
    tenant_deleted_key,
    tenant_pending_keys,
    tenant_ratios_key,
    tenant_segments_key,
    tenant_sessions_key,
    tenant_staging_key,
    validate_id,
)
from ctxstore.settings import Settings

__all__ = [
    "POD_USER",
    "WORKER_USER",
    "AclUser",
    "render_acl",
    "tenant_user_name",
    "users",
]

POD_USER = "ctxstore-pod"
WORKER_USER = "ctxstore-worker"

CONNECTION = ("ping", "client|setname", "select")
"""What redis-py sends on a new connection. (It also tries CLIENT SETINFO, unknown
before Redis 7.2 and ignored when refused.)"""

STORE = (
    "del", "exec", "exists", "fcall", "fcall_ro", "get", "hdel", "hexists", "hget", "hgetall",
    "hincrby", "hkeys", "hlen", "hmget", "hset", "hvals", "multi", "discard", "persist",
    "pexpire", "pttl", "rename", "sadd", "set", "time", "unlink", "wait", "xadd", "xdel", "xlen",
    "xrange", "xrevrange", "xtrim", "zadd", "zcard", "zrange", "zrangebyscore",
    "zremrangebyscore", "zrem", "zrevrangebyscore", "zscan", "zscore",
)  # fmt: skip
"""The SDK's commands (WAIT for ``replica_acks``, FCALL where the library is loaded, and
FCALL_RO for its reads on a full Redis),
and those its Lua scripts call (TIME, RENAME and HEXISTS among them; UNLINK, so a big
key is freed off the main thread)."""

SCRIPTS = ("eval", "evalsha")
"""Scripts of the caller's own: the pods' and workers' users (trusted code: the SDK runs its
scripts so where the library is not loaded); never a tenant's own user, which could block
the server."""

ENQUEUE = ("watch", "unwatch", "psetex", "get")
"""arq's enqueue and job status, beyond the store's commands."""

WORKER = (
    "acl|users", "expire", "incr", "incrby", "set", "setex", "smembers", "srem", "sscan",
    "zincrby", "zrangebyscore",
)  # fmt: skip
"""An arq worker (polling, in-progress locks, retries, results, health) and the sweep, which
finds the tenants that have users of their own by the users' names (``ACL USERS``)."""


@dataclass(frozen=True)
class AclUser:
    """One ACL user.

    Attributes:
        name: The user name.
        password: Its password (rendered as a SHA-256 hash).
        keys: Key patterns it may read and write.
        read_keys: Key patterns it may only read.
        commands: Commands (or ``command|subcommand``) it may run.
        selectors: Extra ``(...)`` rules, each a narrower grant.
    """

    name: str
    password: str
    keys: tuple[str, ...]
    commands: tuple[str, ...]
    read_keys: tuple[str, ...] = ()
    selectors: tuple[str, ...] = field(default=())

    def render(self) -> str:
        """The user's line in an ACL file."""
        digest = hashlib.sha256(self.password.encode()).hexdigest()
        parts = [
            f"user {self.name} on #{digest} resetkeys resetchannels -@all",
            *(f"+{command}" for command in sorted(set(self.commands))),
            *(f"~{pattern}" for pattern in self.keys),
            *(f"%R~{pattern}" for pattern in self.read_keys),
            *self.selectors,
        ]
        return " ".join(parts)


TENANT_USER_PREFIX = "ctxstore-t-"


def tenant_user_name(tenant: str) -> str:
    """The name of a tenant's own user."""
    return f"{TENANT_USER_PREFIX}{validate_id(tenant, 'tenant')}"


def users(
    settings: Settings, tenants: Iterable[str], passwords: Mapping[str, str]
) -> list[AclUser]:
    """The pod and worker users, and one user per tenant.

    Args:
        settings: The key prefix and queue name.
        tenants: Tenants that get a user of their own.
        passwords: User name -> password, for every user rendered.
    """
    prefix = settings.key_prefix
    queue = settings.queue_name
    store_keys = (f"{prefix}:*",)
    queue_keys = ("arq:*", f"{queue}*")
    rendered = [
        AclUser(
            POD_USER,
            passwords[POD_USER],
            store_keys + queue_keys,
            CONNECTION + STORE + SCRIPTS + ENQUEUE,
        ),
        AclUser(
            WORKER_USER,
            passwords[WORKER_USER],
            store_keys + queue_keys,
            CONNECTION + STORE + SCRIPTS + ENQUEUE + WORKER,
        ),
    ]
    for tenant in tenants:
        name = tenant_user_name(tenant)
        rendered.append(
            AclUser(
                name,
                passwords[name],
                # The tenant's sessions ({tenant:session}, their segments too), its index,
                # the index's pending reservations and its segments' registry ({tenant}).
                (
                    f"{prefix}:{{{tenant}:*",
                    tenant_sessions_key(prefix, tenant),
                    *tenant_pending_keys(prefix, tenant),
                    tenant_deleted_key(prefix, tenant),
                    tenant_ratios_key(prefix, tenant),
                    tenant_segments_key(prefix, tenant),
                    tenant_staging_key(prefix, tenant),
                ),
                CONNECTION + STORE,
                # Its quotas are the operator's: readable, not writable. No shared key at
                # all: the workers' sweep finds the tenant by this user's name.
                read_keys=(f"{prefix}:{{{tenant}}}:limits",),
            )
        )
    return rendered


def render_acl(settings: Settings, tenants: Iterable[str], passwords: Mapping[str, str]) -> str:
    """An ACL file holding :func:`users`, one line each.

    Load it with ``aclfile`` (or ``ACL LOAD``) on every node: ACLs are not
    replicated. The file holds no ``default`` user: add your own admin line
    (an ACL file may hold no comments).
    """
    return "".join(user.render() + "\n" for user in users(settings, tenants, passwords))
