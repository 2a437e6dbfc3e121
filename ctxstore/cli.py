"""The ``ctxstore`` command: the demo, the worker, and what operators look at.

```
ctxstore demo                           several pods share sessions; a worker summarizes
ctxstore worker [--burst] [--check]     run a summary worker (arq), or check that one is healthy
ctxstore sessions [--tenant T]          a tenant's sessions, most recent first
ctxstore status SESSION                 a session's counters, summary and jobs
ctxstore view SESSION [--budget N]      the request view a model would get, and its stats
ctxstore limits [--sessions N] [--unset NAME]   the limits in force; set or unset one
ctxstore forget --tenant T --dry-run|--yes      delete every session of a tenant
ctxstore sweep                          queue the summaries whose job was lost or failed
ctxstore acl --credentials F [--out F]  render least-privilege ACL users
ctxstore functions load|show            the scripts as Redis Functions
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
import re
import secrets
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
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

    from ctxstore._cli_render import LimitRow
    from ctxstore.models import SessionInfo, TenantLimits
    from ctxstore.settings import Settings
    from ctxstore.store import ContextStore

__all__ = ["LIMIT_FLAGS", "main"]

USAGE_ERROR = 2
"""Exit status for a usage, configuration, connection or permission error (argparse's too)."""


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def _positive(what: str, high: Callable[[], int]) -> Callable[[str], int]:
    """An argparse type: a whole number of ``what`` from 1 to ``high()``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a positive number of {what}, not {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive number of {what}, not {value}")
        if value > high():
            raise argparse.ArgumentTypeError(f"must be at most {high():,} {what}, not {value:,}")
        return value

    return parse


def _max_budget() -> int:
    from ctxstore.budget import MAX_BUDGET  # when --budget is given: --help stays light

    return MAX_BUDGET


LIMIT_FLAGS: dict[str, Callable[[str], int | float]] = {
    "message_bytes": _whole,
    "session_bytes": _whole,
    "session_tokens": _whole,
    "sessions": _whole,
    "appends_per_second": float,
    "append_burst": _whole,
    "ttl_seconds": _whole,
}
"""The ``limits`` flags: ``TenantLimits``'s fields (a test keeps the two the same)."""

LIMITS: dict[str, tuple[str, str, str, str]] = {
    "message_bytes": ("max_message_bytes", "bytes", "the largest message, as JSON", "262144"),
    "session_bytes": ("session_bytes", "bytes", "the most one session may hold", "50000000"),
    "session_tokens": ("session_tokens", "tokens", "the most one session may hold", "2000000"),
    "sessions": ("max_sessions", "sessions", "the most sessions the tenant may have", "1000"),
    "appends_per_second": (
        "appends_per_second",
        "appends/s",
        "one session's sustained append rate",
        "20 or 2.5",
    ),
    "append_burst": ("append_burst", "appends", "the burst that rate allows", "100"),
    "ttl_seconds": (
        "session_ttl_seconds",
        "seconds",
        "sessions expire this long after their last write",
        "2592000, 30 days",
    ),
}
"""Each limit: the ``Settings`` field it falls back to, its unit, its help, an example."""

LISTED_MAX = 10_000
"""The most sessions one listing reads (``list_sessions``' own bound)."""

ACL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


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
        from ctxstore.demo import main as demo

        return demo(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(args)
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


def _command(
    commands: Any, name: str, summary: str, description: str, examples: Sequence[str]
) -> argparse.ArgumentParser:
    """A subcommand with a description and examples (shown by ``ctxstore NAME --help``)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + "\n".join(f"  {example}" for example in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(command_parser=parser)  # its usage for errors found after parsing
    return parser


def _tenant_flag(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--tenant",
        required=required,
        metavar="T",
        help="the tenant id (e.g. acme)"
        + ("; required: forget never picks one for you" if required else "")
        + ("" if required else "; default: CTXSTORE_TENANT, else 'default'"),
    )


def _json_flag(parser: argparse.ArgumentParser, keys: str) -> None:
    parser.add_argument(
        "--json", action="store_true", help=f"print JSON for scripts instead of a table ({keys})"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxstore",
        description="ctxstore: a multi-tenant context store for LLM agents, on Redis.\n"
        "What operators look at and change, the summary worker, and the demo.",
        epilog=(
            "Settings come from CTXSTORE_* variables (CTXSTORE_REDIS_URL: the store's Redis; "
            "unset: the embedded one).\nRun `ctxstore COMMAND --help` for a command's flags "
            "and examples."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "demo",
        help="run the demo: pods share sessions, a worker summarizes (`ctxstore demo --help`)",
        add_help=False,
    )
    _worker_parser(commands)
    _read_parsers(commands)
    _limits_parser(commands)
    _forget_parser(commands)
    sweep = _command(
        commands,
        "sweep",
        "queue the summaries that are due with no live job",
        "Queue again the summaries whose job was lost (a pod died before it queued it) or "
        "failed long ago.\nThe workers run this every minute; run it by hand after an outage.",
        ["ctxstore sweep", "ctxstore sweep --json"],
    )
    _json_flag(sweep, "keys: sessions, queued, waiting")
    _acl_parser(commands)
    functions = _command(
        commands,
        "functions",
        "load the scripts as Redis Functions (for CTXSTORE_SCRIPT_MODE=functions)",
        "Tenants' own ACL users run the scripts by FCALL: load the library once per "
        "server\n(as an admin), after each upgrade of ctxstore.",
        ["ctxstore functions load", "ctxstore functions show > ctxstore.lua"],
    )
    functions.add_argument(
        "action",
        choices=["load", "show"],
        help="load: FUNCTION LOAD REPLACE on every node; show: print the library",
    )
    embedded = _command(
        commands,
        "embedded",
        "stop the embedded Redis used when CTXSTORE_REDIS_URL is unset",
        "With no CTXSTORE_REDIS_URL, the first process starts a Redis that keeps its data in\n"
        "CTXSTORE_DATA_DIR (default: your user data directory) and serves every later process.\n"
        "Stopping it keeps the data: the next process that needs it starts it again.",
        ["ctxstore embedded stop", "CTXSTORE_DATA_DIR=/tmp/scratch ctxstore embedded stop"],
    )
    embedded.add_argument("action", choices=["stop"], help="stop: shut its server down")
    return parser


def _worker_parser(commands: Any) -> None:
    worker = _command(
        commands,
        "worker",
        "run a summary worker (arq), or check that one is healthy",
        "One arq worker for every tenant: it summarizes sessions (up to 16 jobs at once) and "
        "runs the sweep\nevery minute. It stops on SIGTERM after its running jobs finish.",
        [
            "ctxstore worker",
            "ctxstore worker --log-level DEBUG --log-format json",
            "ctxstore worker --burst        # until the queue is empty",
            "ctxstore worker --check        # exit 0 while this host's worker is healthy",
        ],
    )
    worker.add_argument(
        "--burst", action="store_true", help="stop once the queue is empty (for tests and cron)"
    )
    worker.add_argument(
        "--check",
        action="store_true",
        help="exit 0 if this worker's health-check key (refreshed every 10 s) exists; 1 if not",
    )
    worker.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="the least severe level logged (e.g. DEBUG); default: CTXSTORE_LOG_LEVEL, else INFO",
    )
    worker.add_argument(
        "--log-format",
        choices=["text", "json"],
        type=str.lower,
        help="text: one readable line per event; json: one JSON object per line, for log "
        "shippers; default: CTXSTORE_LOG_FORMAT, else text",
    )


def _read_parsers(commands: Any) -> None:
    sessions = _command(
        commands,
        "sessions",
        "list a tenant's sessions, most recently active first",
        "A table of the tenant's sessions: messages, tokens, how much the summary covers, "
        "and the last\nactivity (local time, with its zone).",
        [
            "ctxstore sessions",
            "ctxstore sessions --tenant acme --limit 10",
            "ctxstore sessions --json",
        ],
    )
    _tenant_flag(sessions)
    sessions.add_argument(
        "--limit",
        type=_positive("sessions", lambda: LISTED_MAX),
        default=50,
        metavar="N",
        help=f"list at most N sessions, 1 to {LISTED_MAX:,} (default 50)",
    )
    _json_flag(
        sessions,
        "keys: tenant, sessions[]: session, messages, tokens, summarized_tokens, "
        "summary_coverage, last_active_ms, last_active",
    )

    status = _command(
        commands,
        "status",
        "a session's counters, summary and jobs",
        "One session: its messages and tokens, what the summary covers and saves, whether a "
        "summary\nis due and what its job is doing, the last job's outcome and error.",
        ["ctxstore status conv-42", "ctxstore status conv-42 --tenant acme --json"],
    )
    status.add_argument("session", help="the session id (e.g. conv-42)")
    _tenant_flag(status)
    _json_flag(status, "keys: every SessionInfo field, summary_covers_at_ms, job")

    view = _command(
        commands,
        "view",
        "the request view a model would get, and its stats",
        "What a pod would send before its next model call: system and pinned messages, the "
        "summary,\nthen the newest messages that fit the budget. Makes no model call.",
        [
            "ctxstore view conv-42",
            "ctxstore view conv-42 --budget 8000 --model claude-sonnet-4-5 --messages",
            "ctxstore view conv-42 --json | jq '.messages | length'",
        ],
    )
    view.add_argument("session", help="the session id (e.g. conv-42)")
    _tenant_flag(view)
    view.add_argument(
        "--budget",
        type=_positive("tokens", _max_budget),
        metavar="TOKENS",
        help="the token budget, in the model's tokens (e.g. 8000); "
        "default: CTXSTORE_DEFAULT_TOKEN_BUDGET (100,000)",
    )
    view.add_argument(
        "--model",
        metavar="NAME",
        help="the model the view is for, for its tokenizer's safety factor "
        "(e.g. claude-sonnet-4-5)",
    )
    view.add_argument(
        "--messages", action="store_true", help="list the messages too, one line each"
    )
    _json_flag(view, "keys: tenant, session, stats (every ViewStats field), messages")


def _limits_parser(commands: Any) -> None:
    limits = _command(
        commands,
        "limits",
        "show the limits in force for a tenant; set or unset its own",
        "Each limit in force and where it comes from: the tenant's own limit, a CTXSTORE_* "
        "setting,\nthe built-in default, or none. Flags set the tenant's own; --unset drops "
        "one, so the\nsetting applies again. Changes reach every process within 30 s.",
        [
            "ctxstore limits --tenant acme",
            "ctxstore limits --tenant acme --sessions 1000 --ttl-seconds 2592000",
            "ctxstore limits --tenant acme --unset sessions --unset ttl-seconds",
            "ctxstore limits --tenant acme --json",
        ],
    )
    _tenant_flag(limits)
    for name, kind in LIMIT_FLAGS.items():
        _, unit, text, example = LIMITS[name]
        limits.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            type=kind,
            default=None,
            metavar={"bytes": "BYTES", "tokens": "TOKENS", "seconds": "SECONDS"}.get(
                unit, "RATE" if kind is float else "N"
            ),
            help=f"{text}, in {unit} (e.g. {example})",
        )
    limits.add_argument(
        "--unset",
        action="append",
        default=[],
        type=_limit_name,
        metavar="NAME",
        help="drop the tenant's own limit NAME (repeatable; e.g. sessions, ttl-seconds)",
    )
    _json_flag(
        limits,
        "keys: tenant, limits.<name>: value, unit, source (tenant|setting|default|none), "
        "variable, tenant_value, default",
    )


def _limit_name(text: str) -> str:
    name = text.strip().lstrip("-").replace("-", "_")
    if name not in LIMIT_FLAGS:
        names = ", ".join(n.replace("_", "-") for n in LIMIT_FLAGS)
        raise argparse.ArgumentTypeError(f"{text!r} is not a limit; one of: {names}")
    return name


def _forget_parser(commands: Any) -> None:
    forget = _command(
        commands,
        "forget",
        "delete every session of a tenant, its limits and its index",
        "Deletes every session of the tenant (history, summary, view), its own limits and "
        "index.\nStop the tenant's writers first. --dry-run lists what would go; --yes "
        "deletes. It cannot be undone.",
        [
            "ctxstore forget --tenant acme --dry-run",
            "ctxstore forget --tenant acme --yes",
        ],
    )
    _tenant_flag(forget, required=True)
    choice = forget.add_mutually_exclusive_group()
    choice.add_argument(
        "--dry-run",
        action="store_true",
        help="list the sessions that would be deleted; delete nothing",
    )
    choice.add_argument("--yes", action="store_true", help="really delete them")
    _json_flag(
        forget,
        "keys: tenant, dry_run, sessions[] and more (--dry-run), deleted_sessions (--yes)",
    )


def _acl_parser(commands: Any) -> None:
    acl = _command(
        commands,
        "acl",
        "render least-privilege Redis ACL users, and their passwords",
        "Renders an ACL file (Redis 7 syntax, SHA-256 password hashes) with the users "
        "ctxstore-pod (agent\npods), ctxstore-worker (workers), one ctxstore-t-<tenant> per "
        "--tenant, and with --admin and\n--probe a complete file for `aclfile`. Run it with "
        "the CTXSTORE_KEY_PREFIX and\nCTXSTORE_QUEUE_NAME of the deployment: the key "
        "patterns come from them. Both files are\nwritten owner-only (0600).",
        [
            "ctxstore acl --out users.acl --credentials creds.json --tenant acme",
            "ctxstore acl --out users.acl --credentials creds.json --admin admin "
            "--probe ctxstore-probe",
        ],
    )
    acl.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="the ACL file to write (e.g. users.acl); default: stdout",
    )
    acl.add_argument(
        "--credentials",
        required=True,
        metavar="FILE",
        help="where to write every user's password, as JSON {user: password} (e.g. creds.json)",
    )
    acl.add_argument(
        "--tenant",
        dest="tenants",
        action="append",
        default=[],
        metavar="T",
        help="also render tenant T's own user, ctxstore-t-T (repeatable; e.g. acme)",
    )
    acl.add_argument(
        "--admin",
        type=_acl_user_name,
        metavar="NAME",
        help="add an administrator NAME (every command and key) and turn off the "
        "password-less `default` user (e.g. admin)",
    )
    acl.add_argument(
        "--probe",
        type=_acl_user_name,
        metavar="NAME",
        help="add a user NAME that may only PING, for health probes (e.g. ctxstore-probe)",
    )


def _acl_user_name(text: str) -> str:
    if not ACL_NAME.fullmatch(text) or text == "default":
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a user name ctxstore renders: letters, digits, '.', '_' "
            "and '-', up to 64, not 'default'"
        )
    return text


def _check_args(args: argparse.Namespace) -> None:
    """Checks that span flags, reported as argparse reports its own (exit status 2)."""
    parser: argparse.ArgumentParser = args.command_parser
    if args.command == "limits":
        both = [n for n in args.unset if getattr(args, n) is not None]
        if both:
            flag = both[0].replace("_", "-")
            parser.error(f"--{flag} and --unset {flag} contradict each other")
    if args.command == "acl" and args.admin is not None and args.admin == args.probe:
        parser.error("--admin and --probe must name different users")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ctxstore")
    except PackageNotFoundError:
        return "(not installed)"


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
    build_worker(settings, burst=args.burst).run()
    return 0


async def _check_worker(settings: Settings, key: str) -> int:
    from ctxstore.jobs import SummaryQueue

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
    from ctxstore._cli_render import SessionRow, show_sessions

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
    from ctxstore._cli_render import progress

    found: list[SessionInfo] = []
    batch = 32
    with progress("reading sessions", len(sessions)) as advance:
        for start in range(0, len(sessions), batch):
            names = sessions[start : start + batch]
            found += await asyncio.gather(*(store.info(s, pins=False) for s in names))
            advance(len(names))
    return found


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli_render import show_status

    async with _store(settings, args.tenant) as store:
        info = await store.info(args.session)
    if not info.exists:
        return _no_session(info)
    job = await _job_state(settings, info) if info.summary_due else None
    show_status(info, job, as_json=args.json)
    return 0


async def _job_state(settings: Settings, info: SessionInfo) -> str:
    """The state of the due summary's job on the queue, or why it is unknown."""
    from ctxstore.jobs import SummaryQueue

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
    from ctxstore._cli_render import show_view

    async with _store(settings, args.tenant) as store:
        info = await store.info(args.session, pins=False)
        if not info.exists:
            return _no_session(info)
        view = await store.view(args.session, token_budget=args.budget, model=args.model)
    show_view(info.tenant, args.session, view, messages=args.messages, as_json=args.json)
    return 0


async def _sweep(settings: Settings, args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ctxstore._cli_render import show_sweep
    from ctxstore.jobs import SummaryQueue
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

    from ctxstore._cli_render import show_limits
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

    As ``tenancy.Quotas.resolved`` combines them: the tenant's own value,
    else the setting's; ``message_bytes`` is capped by the setting whatever
    the tenant's own.
    """
    from ctxstore._cli_render import LimitRow

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
    from ctxstore._cli_render import emit_json, show_forget_plan

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

    from ctxstore.acl import POD_USER, WORKER_USER, AclUser, render_acl, tenant_user_name

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
    from ctxstore._scripts import LIBRARY_NAME, library

    if args.action == "show":
        print(library(), end="")
        return 0
    async with _store(settings, None) as store:
        nodes = await store._connection.load_functions()
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
    "acl": _acl,
    "embedded": _embedded,
    "forget": _forget,
    "functions": _functions,
    "limits": _limits,
    "sessions": _sessions,
    "status": _status,
    "sweep": _sweep,
    "view": _view,
}

_CONNECTING = frozenset({"forget", "limits", "sessions", "status", "sweep", "view", "worker"})
"""Commands that connect to the store's Redis (``functions load`` too)."""


if __name__ == "__main__":
    sys.exit(main())
