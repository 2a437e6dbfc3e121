"""The ``ctxstore`` command: the demo, the worker, and what operators look at.

```
ctxstore demo                           several pods share sessions; a worker summarizes
ctxstore worker [--burst] [--check] [--metrics-port N]   run a summary worker, or check one
ctxstore sessions [--tenant T]          a tenant's sessions, most recent first
ctxstore status SESSION                 a session's counters, summary and jobs
ctxstore view SESSION [--budget N]      the request view a model would get, and its stats
ctxstore search SESSION QUERY           the best matches in a session's whole history
ctxstore checkpoint SESSION [--list]    record (or list) where a session is
ctxstore rewind SESSION TO              end its history at a checkpoint or an entry
ctxstore fork SESSION NEW [--at ID]     a new session from its history
ctxstore export SESSION|--all [--out F] JSON Lines; ctxstore import F reads them back
ctxstore compact SESSION                queue a summary now and wait for it
ctxstore limits [--sessions N] [--unset NAME]   the limits in force; set or unset one
ctxstore forget --tenant T --dry-run|--yes      delete every session of a tenant
ctxstore sweep                          queue the summaries whose job was lost or failed
ctxstore acl --credentials F [--out F]  render least-privilege ACL users
ctxstore functions load|prune|show      the scripts as Redis Functions (run by FCALL)
ctxstore embedded stop                  stop the embedded Redis (its data stays)
```

Settings come from ``CTXSTORE_*`` variables, read when a command runs. Every
read command takes ``--json`` (stable keys, for scripts). Errors are one line
on stderr naming the setting to fix; exit status 2 for a configuration,
connection, permission or usage error, 1 for anything else that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ctxstore.errors import (
    ConfigurationError,
    CtxstoreError,
    ForgetIncompleteError,
    InvalidInputError,
    PermissionDeniedError,
    StoreError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

    from ctxstore._cli.render import LimitRow
    from ctxstore.models import SessionInfo, TenantLimits
    from ctxstore.settings import Settings
    from ctxstore.store import ContextStore

from ctxstore._cli.args import LIMIT_FLAGS, LIMITS, LISTED_MAX, check_args
from ctxstore._cli.args import parser as _parser
from ctxstore._cli.history import COMMANDS as HISTORY_COMMANDS

__all__ = ["LIMITS", "LIMIT_FLAGS", "main"]

USAGE_ERROR = 2
"""Exit status for a usage, configuration, connection or permission error (argparse's too)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    A closed stdout (``ctxstore sessions | head -1``) ends the command
    quietly, as the Python documentation recommends for SIGPIPE.
    """
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at devnull so that
        # flush cannot fail with a second BrokenPipeError and a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    return code


def _main(argv: list[str]) -> int:
    if argv[:1] == ["demo"]:
        from ctxstore._cli.demo import main as demo

        return demo(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    check_args(args)
    from ctxstore.settings import Settings

    settings: Settings | None = None
    try:
        settings = Settings()
        if args.command in _CONNECTING or getattr(args, "action", None) == "load":
            _check_url(settings)
        if args.command == "worker":
            return _worker(settings, args)
        return asyncio.run(_COMMANDS[args.command](settings, args))
    except CtxstoreError as exc:
        line, code = _explain(exc, settings)
        print(f"ctxstore: {line}", file=sys.stderr)
        return code


# -- errors ----------------------------------------------------------------------


def _check_url(settings: Settings) -> None:
    """Refuse a store URL redis-py would refuse with a traceback (an ``http://`` URL)."""
    url = settings.redis_url
    if url is None:
        return
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ConfigurationError(f"CTXSTORE_REDIS_URL is not a valid URL: {exc}") from exc
    if parts.scheme not in ("redis", "rediss", "unix"):
        scheme = f"{parts.scheme}://" if parts.scheme else "a URL without a scheme"
        raise ConfigurationError(
            f"CTXSTORE_REDIS_URL must be a redis://, rediss:// or unix:// URL, not {scheme}"
        )


def _explain(exc: CtxstoreError, settings: Settings | None) -> tuple[str, int]:
    """The one line (and exit status) an error is reported with, naming what to fix."""
    message = str(exc)
    variable, where = _url_setting(message, settings)
    if isinstance(exc, ForgetIncompleteError):
        line = f"forget of tenant {exc.tenant!r} is incomplete: {_bare(exc)}"
        if isinstance(exc.__cause__, PermissionDeniedError):
            line += f" (the Redis user of {variable} may not delete the rest)"
        return line, USAGE_ERROR
    if isinstance(exc, PermissionDeniedError):
        # errors.py has one class for both; the connection's edge words them apart.
        if "refused the credentials" in message:
            return f"{message}; check the user and password in {variable}", USAGE_ERROR
        return f"{message}; run it as a Redis user that may ({variable})", USAGE_ERROR
    if isinstance(exc, StoreUnavailableError):
        # Which key the call was for says nothing about a Redis that does not answer.
        return (
            f"{_bare(exc).rstrip('. ')}; is Redis running at {where}? Check {variable}",
            USAGE_ERROR,
        )
    if isinstance(exc, ConfigurationError | InvalidInputError):
        return message, USAGE_ERROR
    return message, 1


def _bare(exc: CtxstoreError) -> str:
    """The error's message without the ``(tenant=..., key=...)`` that ``CtxstoreError`` adds."""
    where = [
        f"{name}={value!r}"
        for name, value in (("tenant", exc.tenant), ("session", exc.session), ("key", exc.key))
        if value is not None
    ]
    return str(exc).removesuffix(f" ({', '.join(where)})" if where else "")


def _url_setting(message: str, settings: Settings | None) -> tuple[str, str]:
    """The setting naming the Redis an error is about, and that Redis's address (no password)."""
    if settings is None:
        return "CTXSTORE_REDIS_URL", "its URL"
    if settings.queue_url is not None and message.startswith("the summary queue's"):
        return "CTXSTORE_QUEUE_URL", _address(settings.queue_url)
    if settings.redis_url is None:
        return "CTXSTORE_REDIS_URL (unset: the embedded Redis)", "the embedded Redis"
    return "CTXSTORE_REDIS_URL", _address(settings.redis_url)


def _address(url: str) -> str:
    """Where a URL points, without its user or password."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return parts.path
        return f"{parts.hostname}:{parts.port or 6379}"
    except ValueError:
        return "its URL"


# -- the parser ------------------------------------------------------------------


# -- the worker --------------------------------------------------------------------


def _worker(settings: Settings, args: argparse.Namespace) -> int:
    overrides = {
        name: value
        for name, value in (("log_level", args.log_level), ("log_format", args.log_format))
        if value is not None
    }
    settings = settings.model_copy(update=overrides)
    try:
        from workers import build_worker, health_check_key
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"the worker needs the worker extra ({exc.name} is missing): "
            "pip install 'ctxstore[worker]'"
        ) from exc
    if args.check:
        return asyncio.run(_check_worker(settings, health_check_key(settings)))
    served = {} if args.metrics_port is None else {"metrics_port": args.metrics_port}
    build_worker(settings, burst=args.burst, **served).run()
    return 0


async def _check_worker(settings: Settings, key: str) -> int:
    from ctxstore.summary_queue import SummaryQueue

    queue = await SummaryQueue.connect(settings)
    try:
        found = await queue.read(key)
    finally:
        await queue.aclose()
    print(found if found else f"no health check at {key}")
    return 0 if found else 1


# -- read commands ---------------------------------------------------------------


def _store(settings: Settings, tenant: str | None) -> ContextStore:
    from ctxstore.store import ContextStore

    return ContextStore.from_settings(settings, tenant=tenant)


async def _sessions(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import SessionRow, show_sessions

    async with _store(settings, args.tenant) as store:
        listed = await store.list_sessions(limit=args.limit)
        infos = await _infos(store, [row.session for row in listed])
        tenant = store.tenant
    rows = [
        SessionRow.of(info, row.last_active_ms)
        for row, info in zip(listed, infos, strict=True)
        if info.exists  # deleted between the listing and its read
    ]
    show_sessions(tenant, rows, as_json=args.json)
    return 0


async def _infos(store: ContextStore, sessions: list[str]) -> list[SessionInfo]:
    """Each session's counters, a batch of round trips at a time."""
    from ctxstore._cli.render import progress

    found: list[SessionInfo] = []
    batch = 32
    with progress("reading sessions", len(sessions)) as advance:
        for start in range(0, len(sessions), batch):
            names = sessions[start : start + batch]
            found += await asyncio.gather(*(store.info(s, pins=False) for s in names))
            advance(len(names))
    return found


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import show_status

    async with _store(settings, args.tenant) as store:
        info = await store.info(args.session)
    if not info.exists:
        return _no_session(info)
    job = await _job_state(settings, info) if info.summary_due else None
    show_status(info, job, as_json=args.json)
    return 0


async def _job_state(settings: Settings, info: SessionInfo) -> str:
    """The state of the due summary's job on the queue, or why it is unknown."""
    from ctxstore.summary_queue import SummaryQueue

    try:
        queue = await SummaryQueue.connect(settings)
    except StoreError as exc:
        return f"unknown: {exc}"
    try:
        return str(await queue.status(info.tenant, info.session, info.summary_generation))
    except StoreError as exc:
        return f"unknown: {exc}"
    finally:
        await queue.aclose()


def _no_session(info: SessionInfo) -> int:
    print(f"ctxstore: no session {info.session!r} for tenant {info.tenant!r}", file=sys.stderr)
    return 1


async def _view(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import show_view

    async with _store(settings, args.tenant) as store:
        info = await store.info(args.session, pins=False)
        if not info.exists:
            return _no_session(info)
        view = await store.view(args.session, token_budget=args.budget, model=args.model)
    show_view(info.tenant, args.session, view, messages=args.messages, as_json=args.json)
    return 0


async def _search(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import show_search

    async with _store(settings, args.tenant) as store:
        info = await store.info(args.session, pins=False)
        if not info.exists:
            return _no_session(info)
        hits = await store.search(args.session, args.query, limit=args.limit)
    show_search(info.tenant, args.session, args.query, hits, as_json=args.json)
    return 0


async def _sweep(settings: Settings, args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ctxstore._cli.render import show_sweep
    from ctxstore.summary_queue import SummaryQueue
    from workers.logs import configure
    from workers.sweep import sweep

    configure(settings.log_level, settings.log_format)  # skipped sessions, timestamped
    queue = await SummaryQueue.connect(settings)
    try:
        async with _store(settings, None) as base:
            report = await sweep(base, queue)
    finally:
        await queue.aclose()
    show_sweep(asdict(report), as_json=args.json)
    return 0


# -- limits ------------------------------------------------------------------------


def _limits_error(exc: ValidationError) -> str:
    """One line per refused flag, named as it was given."""
    return "; ".join(
        f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}"
        if error["loc"]
        else error["msg"]
        for error in exc.errors(include_url=False)
    )


async def _limits(settings: Settings, args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ctxstore._cli.render import show_limits
    from ctxstore.models import TenantLimits

    changes = {name: getattr(args, name) for name in LIMIT_FLAGS if getattr(args, name) is not None}
    try:
        TenantLimits(**changes)  # refused before anything is read or written
    except ValidationError as exc:
        print(f"ctxstore: invalid limits: {_limits_error(exc)}", file=sys.stderr)
        return USAGE_ERROR
    async with _store(settings, args.tenant) as store:
        if changes or args.unset:
            current = (await store.limits()).model_dump()
            dropped = dict.fromkeys(args.unset)
            await store.set_limits(TenantLimits(**{**current, **changes, **dropped}))
        own = await store.limits()
        tenant = store.tenant
    show_limits(tenant, _limits_in_force(own, settings), as_json=args.json)
    return 0


def _limits_in_force(own: TenantLimits, settings: Settings) -> list[LimitRow]:
    """Each limit in force for a tenant and where it comes from.

    As ``quotas.Quotas.resolved`` combines them: the tenant's own value,
    else the setting's; ``message_bytes`` is capped by the setting whatever
    the tenant's own.
    """
    from ctxstore._cli.render import LimitRow

    rows = []
    for name, (field, unit, _, _) in LIMITS.items():
        mine = getattr(own, name)
        default = getattr(settings, field)
        variable = f"CTXSTORE_{field.upper()}"
        value, source = mine, "tenant"
        if mine is None:
            value = default
            source = (
                "none"
                if default is None
                else "setting"
                if field in settings.model_fields_set
                else "default"
            )
        elif name == "message_bytes" and mine > default:
            value, source = default, "setting"  # the settings' cap binds every tenant
        rows.append(LimitRow(name, unit, value, source, variable, mine, default))
    return rows


# -- forget ------------------------------------------------------------------------


async def _forget(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import emit_json, show_forget_plan

    async with _store(settings, args.tenant) as store:
        listed = await store.list_sessions(limit=LISTED_MAX)
        more = len(listed) == LISTED_MAX
        count = f"{len(listed):,}{' or more' if more else ''}"
        if args.dry_run:
            rows = [(row.session, row.last_active_ms) for row in listed]
            show_forget_plan(store.tenant, rows, more=more, as_json=args.json)
            return 0
        if not args.yes:
            print(
                f"ctxstore: forget would delete tenant {store.tenant!r}: {count} sessions, "
                "its limits and its index. Add --yes to delete them (--dry-run lists them).",
                file=sys.stderr,
            )
            return USAGE_ERROR
        removed = await store.forget_tenant()
        tenant = store.tenant
    if args.json:
        emit_json({"tenant": tenant, "dry_run": False, "deleted_sessions": removed})
    else:
        print(f"deleted tenant {tenant!r}: {removed:,} sessions, its limits and its index")
    return 0


# -- acl, functions ----------------------------------------------------------------


async def _acl(settings: Settings, args: argparse.Namespace) -> int:
    import json

    from ctxstore._tenant.acl import POD_USER, WORKER_USER, AclUser, render_acl, tenant_user_name

    rendered = [POD_USER, WORKER_USER, *(tenant_user_name(t) for t in args.tenants)]
    operators = [name for name in (args.admin, args.probe) if name is not None]
    clash = set(operators) & set(rendered)
    if clash:
        raise InvalidInputError(f"--admin and --probe may not name a rendered user: {clash.pop()}")
    passwords = {name: secrets.token_urlsafe(24) for name in [*operators, *rendered]}
    lines = []
    if args.admin is not None:
        # Without this line Redis keeps a `default` user with no password and every right.
        lines.append("user default off\n")
        admin = AclUser(args.admin, passwords[args.admin], keys=("*",), commands=("@all",))
        lines.append(admin.render() + "\n")
    if args.probe is not None:
        probe = AclUser(args.probe, passwords[args.probe], keys=(), commands=("ping",))
        lines.append(probe.render() + "\n")
    text = "".join(lines) + render_acl(settings, args.tenants, passwords)
    _write_private(args.credentials, json.dumps(passwords, indent=2) + "\n")
    if args.out:
        _write_private(args.out, text)
    else:
        print(text, end="")
    return 0


async def _functions(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._redis.functions import load_functions, prune_functions
    from ctxstore._redis.scripts import LIBRARY_NAME, library

    if args.action == "show":
        print(library(), end="")
        return 0
    async with _store(settings, None) as store:
        if args.action == "prune":
            pruned = await prune_functions(store._connection)
            for node, names in pruned.items():
                print(f"deleted on {node}: {', '.join(names) or 'none'} (kept {LIBRARY_NAME})")
            return 0
        nodes = await load_functions(store._connection)
    print(f"loaded {LIBRARY_NAME} on {', '.join(nodes)}")
    return 0


async def _embedded(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore.embedded import stop_embedded, user_data_dir

    where = settings.data_dir or user_data_dir()
    stopped = await asyncio.to_thread(stop_embedded, settings.data_dir)
    print(f"stopped embedded Redis in {where}" if stopped else f"no embedded Redis runs in {where}")
    return 0


def _write_private(path: str, text: str) -> None:
    """Write a file only its owner can read (it holds passwords or their hashes)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an existing file keeps its mode otherwise
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


_COMMANDS = {
    **HISTORY_COMMANDS,
    "acl": _acl,
    "embedded": _embedded,
    "forget": _forget,
    "functions": _functions,
    "limits": _limits,
    "search": _search,
    "sessions": _sessions,
    "status": _status,
    "sweep": _sweep,
    "view": _view,
}

_CONNECTING = frozenset(
    {"forget", "limits", "search", "sessions", "status", "sweep", "view", "worker"}
    | frozenset(HISTORY_COMMANDS)
)
"""Commands that connect to the store's Redis (``functions load`` too)."""


if __name__ == "__main__":
    sys.exit(main())
