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
ctxstore acl --credentials F [--out F]  render least-privilege ACL users (--rotate: new passwords)
ctxstore functions load|prune|show      the scripts as Redis Functions (run by FCALL)
ctxstore embedded stop                  stop the embedded Redis (its data stays)
```

Settings come from ``CTXSTORE_*`` variables, read when a command runs. Every
read command takes ``--json`` (stable keys, for scripts). Errors are one line
on stderr naming the setting to fix. A command reports a failure by raising;
its exit status comes from the one table, :mod:`ctxstore._cli.exits`: 1 when
what it names is not there or did not happen, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ctxstore._cli.exits import ExitStatus, address, explain, status_of
from ctxstore.errors import (
    ConfigurationError,
    CtxstoreError,
    InvalidInputError,
    PermissionDeniedError,
    SessionNotFoundError,
    StoreError,
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
        return ExitStatus.FAILED
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
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
        settings = Settings()  # a malformed URL is refused here, naming its variable
        if args.command == "worker":
            return _worker(settings, args)
        return asyncio.run(_COMMANDS[args.command](settings, args))
    except CtxstoreError as exc:
        print(f"ctxstore: {explain(exc, settings)}", file=sys.stderr)
        return status_of(exc)


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
            "pip install '.[worker]' in a checkout of ctxstore"
        ) from exc
    if args.check:
        return asyncio.run(_check_worker(settings, health_check_key(settings)))
    # A Redis that does not answer is one line, as for every command, rather than
    # arq's retries, each a warning, and its traceback.
    asyncio.run(_reachable(settings))
    served = {} if args.metrics_port is None else {"metrics_port": args.metrics_port}
    build_worker(settings, burst=args.burst, **served).run()
    return ExitStatus.OK


async def _reachable(settings: Settings) -> None:
    """PING the store's Redis and the queue's, each by its own connection, retried as any call.

    Raises:
        StoreUnavailableError: One did not answer.
        PermissionDeniedError: One refused the credentials.
    """
    from ctxstore.summary_queue import SummaryQueue

    async with _store(settings, None) as store:
        connection = store._connection
        await connection.call(lambda: connection.client.ping())
    queue = await SummaryQueue.connect(settings)  # it PINGs
    await queue.aclose()


async def _check_worker(settings: Settings, key: str) -> int:
    from ctxstore.summary_queue import SummaryQueue

    queue = await SummaryQueue.connect(settings)
    try:
        found = await queue.read(key)
    finally:
        await queue.aclose()
    print(found if found else f"no health check at {key}")
    return ExitStatus.OK if found else ExitStatus.FAILED


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
        info = _existing(await store.info(args.session))
    job = await _job_state(settings, info) if info.summary_due else None
    show_status(info, job, as_json=args.json)
    return ExitStatus.OK


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


def _existing(info: SessionInfo) -> SessionInfo:
    """``info``, of a session that exists.

    Raises:
        SessionNotFoundError: It does not.
    """
    if not info.exists:
        raise SessionNotFoundError("no such session", tenant=info.tenant, session=info.session)
    return info


async def _view(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import show_view

    async with _store(settings, args.tenant) as store:
        info = _existing(await store.info(args.session, pins=False))
        view = await store.view(args.session, token_budget=args.budget, model=args.model)
    show_view(info.tenant, args.session, view, messages=args.messages, as_json=args.json)
    return 0


async def _search(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import show_search

    async with _store(settings, args.tenant) as store:
        info = _existing(await store.info(args.session, pins=False))
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
        raise InvalidInputError(f"invalid limits: {_limits_error(exc)}") from exc
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
        if not listed and await _holds_nothing(store):
            raise CtxstoreError(
                f"tenant {store.tenant!r} has no sessions and no limits of its own: nothing "
                "to forget (is the tenant id right? `ctxstore sessions --tenant T` lists "
                "a tenant's sessions)"
            )
        more = len(listed) == LISTED_MAX
        count = f"{len(listed):,}{' or more' if more else ''}"
        if args.dry_run:
            rows = [(row.session, row.last_active_ms) for row in listed]
            show_forget_plan(store.tenant, rows, more=more, as_json=args.json)
            return 0
        if not args.yes:
            raise InvalidInputError(
                f"forget would delete tenant {store.tenant!r}: {count} sessions, "
                "its limits and its index. Add --yes to delete them (--dry-run lists them)."
            )
        removed = await store.forget_tenant()
        tenant = store.tenant
    if args.json:
        emit_json({"tenant": tenant, "dry_run": False, "deleted_sessions": removed})
    else:
        print(f"deleted tenant {tenant!r}: {removed:,} sessions, its limits and its index")
    return 0


async def _holds_nothing(store: ContextStore) -> bool:
    """True when a tenant with no sessions left has nothing else to forget either.

    No limits of its own, and not among the tenants that ever wrote (those
    whose sessions all went still have their tombstones). A Redis user that
    may not list the tenants is answered False: forget then runs, and says
    what it deleted.
    """
    from ctxstore.models import TenantLimits

    if await store.limits() != TenantLimits():
        return False
    try:
        return store.tenant not in await store.list_tenants()
    except PermissionDeniedError:
        return False


# -- acl, functions ----------------------------------------------------------------


async def _acl(settings: Settings, args: argparse.Namespace) -> int:
    import json

    from ctxstore._tenant.acl import POD_USER, WORKER_USER, AclUser, render_acl, tenant_user_name

    rendered = [POD_USER, WORKER_USER, *(tenant_user_name(t) for t in args.tenants)]
    operators = [name for name in (args.admin, args.probe) if name is not None]
    clash = set(operators) & set(rendered)
    if clash:
        raise InvalidInputError(f"--admin and --probe may not name a rendered user: {clash.pop()}")
    users = [*operators, *rendered]
    # Passwords already handed out (in the pods' URLs) stay, unless --rotate.
    known = {} if args.rotate else _known_passwords(args.credentials)
    passwords = {name: known.get(name) or secrets.token_urlsafe(24) for name in users}
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
    print(_acl_report(args, users, known), file=sys.stderr)
    return 0


def _known_passwords(path: str) -> dict[str, str]:
    """The passwords a credentials file already holds (none if there is no file).

    Raises:
        InvalidInputError: It cannot be read, or is not a JSON object of user: password.
    """
    import json

    fix = "fix or remove it, or pass --rotate to make new passwords"
    try:
        with open(path, encoding="utf-8") as source:
            found = json.load(source)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror}; {fix}") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInputError(f"{path} is not JSON ({exc}); {fix}") from exc
    if not isinstance(found, dict) or not all(
        isinstance(user, str) and isinstance(secret, str) and secret
        for user, secret in found.items()
    ):
        raise InvalidInputError(f"{path} is not a JSON object of user: password; {fix}")
    return found


def _acl_report(args: argparse.Namespace, users: list[str], known: dict[str, str]) -> str:
    """What ``acl`` wrote, and which passwords are new."""
    where = args.out or "stdout"
    new = [name for name in users if name not in known]
    if args.rotate:
        passwords = f"{len(users)} new passwords (--rotate)"
    elif not new:
        passwords = f"every password kept from {args.credentials}"
    else:
        kept = len(users) - len(new)
        passwords = f"{kept} kept, {len(new)} new ({', '.join(new)})"
    line = f"wrote {len(users)} users to {where} and their passwords to {args.credentials}: "
    line += passwords
    dropped = sorted(set(known) - set(users))
    if dropped:
        line += f"; dropped {', '.join(dropped)} (not rendered this time)"
    return line


async def _functions(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._redis.functions import load_functions, prune_functions
    from ctxstore._redis.scripts import LIBRARY_NAME, library

    if args.action == "show":
        print(library(), end="")
        return 0
    async with _store(settings, None) as store:
        try:
            if args.action == "prune":
                pruned = await prune_functions(store._connection)
                for node, names in pruned.items():
                    print(f"deleted on {node}: {', '.join(names) or 'none'} (kept {LIBRARY_NAME})")
                return 0
            nodes = await load_functions(store._connection)
        except StoreError as exc:
            if not _unknown_command(exc, "FUNCTION"):
                raise
            url = settings.redis_url
            where = "the embedded Redis" if url is None else f"the Redis at {address(url)}"
            raise ConfigurationError(
                f"{where} has no Functions, which came with Redis 7: nothing to "
                f"{args.action}. Pods run the scripts there by EVALSHA, which needs nothing "
                "loaded; to run them by FCALL, point CTXSTORE_REDIS_URL at Redis 7 or later"
            ) from exc
    print(f"loaded {LIBRARY_NAME} on {', '.join(nodes)}")
    return 0


def _unknown_command(exc: StoreError, command: str) -> bool:
    """True when Redis refused the call for not knowing ``command`` (an older server)."""
    said = str(exc).lower()
    return "unknown command" in said and command.lower() in said


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

if __name__ == "__main__":
    sys.exit(main())
