"""The ``ctxstore`` command: the demo, the worker, and what operators look at.

```
ctxstore demo                     several pods share sessions; a worker summarizes
ctxstore worker [--burst]         run a summary worker (arq); --check: is it healthy?
ctxstore sessions [--tenant T]    a tenant's sessions, most recent first
ctxstore status SESSION           a session's counters, summary lag, last jobs (/context status)
ctxstore view SESSION --budget N  the request view a model would get, and its stats
ctxstore sweep                    queue the summaries whose job was lost or failed
ctxstore limits [--sessions N...] show or set a tenant's quotas and retention
ctxstore forget --tenant T --yes  delete every session of a tenant
ctxstore acl --out F --credentials F [--tenant T...]   render least-privilege ACL users
```

Settings come from ``CTXSTORE_*`` variables, read when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ctxstore.errors import CtxstoreError
from ctxstore.models import TenantLimits
from ctxstore.settings import Settings
from ctxstore.store import ContextStore

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="ctxstore", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the demo", add_help=False)
    worker = commands.add_parser("worker", help="run a summary worker")
    worker.add_argument("--burst", action="store_true", help="stop once the queue is empty")
    worker.add_argument("--check", action="store_true", help="exit 0 if this worker is healthy")
    sessions = commands.add_parser("sessions", help="list a tenant's sessions")
    sessions.add_argument("--limit", type=int, default=50)
    status = commands.add_parser("status", help="a session's counters and summary state")
    status.add_argument("session")
    view = commands.add_parser("view", help="the request view of a session")
    view.add_argument("session")
    view.add_argument("--budget", type=int, default=None)
    view.add_argument("--model", default=None)
    view.add_argument("--messages", action="store_true", help="print the messages too")
    commands.add_parser("sweep", help="queue summaries that are due with no live job")
    limits = commands.add_parser("limits", help="show or set a tenant's quotas and retention")
    for name in TenantLimits.model_fields:
        limits.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=_limit_type(name), default=None
        )
    forget = commands.add_parser("forget", help="delete every session of a tenant")
    forget.add_argument("--yes", action="store_true", help="really delete")
    acl = commands.add_parser("acl", help="render least-privilege ACL users")
    acl.add_argument("--out", default=None, help="the ACL file (stdout by default)")
    acl.add_argument("--credentials", required=True, help="where to write the passwords (JSON)")
    acl.add_argument("--tenant", dest="tenants", action="append", default=[])
    for sub in (sessions, status, view, limits, forget):
        sub.add_argument("--tenant", default=None, help="the tenant (CTXSTORE_TENANT)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from ctxstore.demo import main as demo

        return demo(argv[1:])
    args = parser.parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"ctxstore: invalid settings: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "worker":
            return _worker(settings, burst=args.burst, check=args.check)
        return asyncio.run(_COMMANDS[args.command](settings, args))
    except CtxstoreError as exc:
        print(f"ctxstore: {exc}", file=sys.stderr)
        return 1


def _worker(settings: Settings, *, burst: bool, check: bool) -> int:
    from workers import build_worker, health_check_key

    if check:
        return asyncio.run(_check_worker(settings, health_check_key(settings)))
    worker = build_worker(settings, burst=burst)
    worker.run()
    return 0


async def _check_worker(settings: Settings, key: str) -> int:
    from ctxstore.jobs import SummaryQueue

    queue = await SummaryQueue.connect(settings)
    try:
        found = await queue.pool.get(key)
    finally:
        await queue.aclose()
    print(found.decode() if found else f"no health check at {key}")
    return 0 if found else 1


async def _sessions(settings: Settings, args: argparse.Namespace) -> int:
    async with ContextStore.from_settings(settings, tenant=args.tenant) as store:
        for row in await store.list_sessions(limit=args.limit):
            print(f"{_when(row.last_active_ms)}  {row.session}")
    return 0


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    async with ContextStore.from_settings(settings, tenant=args.tenant) as store:
        info = await store.info(args.session)
    if not info.exists:
        print(f"no session {args.session!r} for tenant {info.tenant!r}")
        return 1
    print(_render_status(asdict(info)))
    return 0


def _render_status(info: dict[str, Any]) -> str:
    lines = [
        f"session   {info['tenant']}/{info['session']}  (epoch {info['epoch']}, seq {info['seq']})",
        f"history   {info['count']:,} messages, {info['tokens']:,} tokens "
        f"({_when(info['first_at_ms'])} .. {_when(info['last_at_ms'])})",
        f"pinned    {len(info['pinned'])} messages",
        f"summary   covers up to {info['summary_covers'] or '-'}, {info['summary_tokens']:,} tokens"
        f" by {info['summary_model'] or '-'}; saves {info['tokens_saved']:,} tokens",
        f"lag       {info['tokens_unsummarized']:,} tokens past the watermark; "
        f"job {'queued/running' if info['summary_due'] else 'none'}",
        f"jobs      {info['summary_runs']} committed, {info['summary_failures']} failed; last "
        f"{info['summary_last_outcome'] or '-'} at {_when(info['summary_last_at_ms'])}"
        + (
            f" in {info['summary_last_seconds']:.2f}s"
            if info["summary_last_seconds"] is not None
            else ""
        ),
    ]
    if info["summary_error"]:
        lines.append(f"error     {info['summary_error']}")
    if info["ttl_seconds"]:
        lines.append(f"ttl       {info['ttl_seconds']}s")
    return "\n".join(lines)


async def _view(settings: Settings, args: argparse.Namespace) -> int:
    async with ContextStore.from_settings(settings, tenant=args.tenant) as store:
        view = await store.view(args.session, token_budget=args.budget, model=args.model)
    if args.messages:
        print(json.dumps(view.messages, indent=2, ensure_ascii=False))
    print(json.dumps(asdict(view.stats), indent=2))
    return 0


async def _sweep(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore.jobs import SummaryQueue, sweep

    queue = await SummaryQueue.connect(settings)
    async with ContextStore.from_settings(settings) as base:
        try:
            report = await sweep(base, queue)
        finally:
            await queue.aclose()
    print(json.dumps(asdict(report)))
    return 0


def _limit_type(name: str) -> Callable[[str], int | float]:
    """The parser of a ``limits`` flag: whole numbers for the integer fields."""
    for arg in typing.get_args(TenantLimits.model_fields[name].annotation):
        if typing.get_origin(arg) is typing.Annotated:
            arg = typing.get_args(arg)[0]
        if arg is float:
            return float
    return _whole


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def _limits_error(exc: ValidationError) -> str:
    """One line per refused flag, named as it was given."""
    return "; ".join(
        f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}"
        if error["loc"]
        else error["msg"]
        for error in exc.errors(include_url=False)
    )


async def _limits(settings: Settings, args: argparse.Namespace) -> int:
    changes = {
        name: getattr(args, name)
        for name in TenantLimits.model_fields
        if getattr(args, name) is not None
    }
    try:
        TenantLimits(**changes)  # refused before anything is read or written
    except ValidationError as exc:
        print(f"ctxstore: invalid limits: {_limits_error(exc)}", file=sys.stderr)
        return 2
    async with ContextStore.from_settings(settings, tenant=args.tenant) as store:
        if changes:
            current = (await store.limits()).model_dump()
            await store.set_limits(TenantLimits(**{**current, **changes}))
        print((await store.limits()).model_dump_json(indent=2))
    return 0


async def _forget(settings: Settings, args: argparse.Namespace) -> int:
    if not args.yes:
        print("ctxstore: forget deletes every session of the tenant; add --yes", file=sys.stderr)
        return 2
    async with ContextStore.from_settings(settings, tenant=args.tenant) as store:
        removed = await store.forget_tenant()
    print(f"deleted {removed} sessions of tenant {store.tenant}")
    return 0


async def _acl(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore.acl import POD_USER, WORKER_USER, render_acl, tenant_user_name

    names = [POD_USER, WORKER_USER, *(tenant_user_name(t) for t in args.tenants)]
    passwords = {name: secrets.token_urlsafe(24) for name in names}
    text = render_acl(settings, args.tenants, passwords)
    _write_private(args.credentials, json.dumps(passwords, indent=2) + "\n")
    if args.out:
        _write_private(args.out, text)
    else:
        print(text, end="")
    return 0


def _write_private(path: str, text: str) -> None:
    """Write a file only its owner can read (it holds passwords or their hashes)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # an existing file keeps its mode otherwise
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


_COMMANDS = {
    "acl": _acl,
    "forget": _forget,
    "limits": _limits,
    "sessions": _sessions,
    "status": _status,
    "sweep": _sweep,
    "view": _view,
}


if __name__ == "__main__":
    sys.exit(main())
