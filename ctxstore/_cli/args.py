"""The ``ctxstore`` command's arguments: the parser of every subcommand, and their checks.

:mod:`ctxstore.cli` runs the commands; this module only describes them, so
``ctxstore --help`` imports nothing but argparse.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

from ctxstore._cli.history import check as check_history
from ctxstore._cli.history import parsers as history_parsers

__all__ = ["LIMITS", "LIMIT_FLAGS", "LISTED_MAX", "check_args", "parser"]


def _version() -> str:
    """The installed ctxstore's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ctxstore")
    except PackageNotFoundError:
        return "(not installed)"


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


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535."""
    value = _whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, not {value}")
    return value


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
    "checkpoints": _whole,
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
    "checkpoints": (
        "max_checkpoints",
        "checkpoints",
        "the most checkpoints one session may keep",
        "100",
    ),
}
"""Each limit: the ``Settings`` field it falls back to, its unit, its help, an example."""

LISTED_MAX = 10_000
"""The most sessions one listing reads (``list_sessions``' own bound)."""

ACL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxstore",
        description="ctxstore: a multi-tenant context store for LLM agents, on Redis.\n"
        "What operators look at and change, the summary worker, and the demo.",
        epilog=(
            "Settings come from CTXSTORE_* variables (CTXSTORE_REDIS_URL: the store's Redis; "
            "unset: the embedded one).\nRun `ctxstore COMMAND --help` for a command's flags "
            "and examples.\nExit status, for every command: 0 done; 1 what it names is not "
            "there, or did not happen;\n2 it could not run (fix the command, a setting or "
            "the server)."
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
    history_parsers(commands, _command, (_tenant_flag, _json_flag))
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
        "load the scripts as Redis Functions (pods then run them by FCALL)",
        "Pods run the scripts by FCALL where the library is loaded (it costs Redis less "
        "than EVALSHA),\nby EVALSHA where it is not; tenants' own ACL users need it. "
        "Load it once per primary\n(as an admin), after each upgrade of ctxstore. Each "
        "version's library has a name of its\nown; prune deletes every other version's "
        "(newer ones too): run it from the newest,\nonce no pod of another version is left.",
        [
            "ctxstore functions load",
            "ctxstore functions prune",
            "ctxstore functions show > ctxstore.lua",
        ],
    )
    functions.add_argument(
        "action",
        choices=["load", "prune", "show"],
        help="load: FUNCTION LOAD REPLACE on every node; prune: delete every other "
        "version's library on every node; show: print the library",
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
            "ctxstore worker --metrics-port 9464   # Prometheus metrics at :9464/metrics",
        ],
    )
    worker.add_argument(
        "--burst",
        action="store_true",
        help="stop once the queue is empty; no sweep (ctxstore sweep is one on demand)",
    )
    worker.add_argument(
        "--check",
        action="store_true",
        help="exit 0 if this worker's health-check key (refreshed every 10 s) exists, 1 if "
        "not, 2 if its Redis cannot be reached",
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://0.0.0.0:PORT/metrics while the worker runs",
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

    search = _command(
        commands,
        "search",
        "search a session's whole history",
        "The entries of the session's whole history that best match the words (BM25 over "
        "text, tool\narguments and tool results), best first, with a snippet each. Entries "
        "appended since the\nindex was last updated are indexed first.",
        [
            'ctxstore search conv-42 "staging database port"',
            'ctxstore search conv-42 "nginx.conf" --tenant acme --limit 3',
            'ctxstore search conv-42 "deploy key" --json',
        ],
    )
    search.add_argument("session", help="the session id (e.g. conv-42)")
    search.add_argument("query", help="the words to look for (quote them)")
    _tenant_flag(search)
    search.add_argument(
        "--limit",
        type=_positive("results", lambda: 100),
        default=10,
        metavar="N",
        help="show at most N results, 1 to 100 (default 10)",
    )
    _json_flag(search, "keys: tenant, session, query, hits[]: entry_id, role, score, snippet")


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
        "patterns come from them. Both files are\nwritten owner-only (0600). Run again, it "
        "keeps the passwords the credentials file holds\n(new users get new ones); --rotate "
        "makes every password new.",
        [
            "ctxstore acl --out users.acl --credentials creds.json --tenant acme",
            "ctxstore acl --out users.acl --credentials creds.json --admin admin "
            "--probe ctxstore-probe",
            "ctxstore acl --out users.acl --credentials creds.json --rotate",
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
        help="where to write every user's password, as JSON {user: password} (e.g. creds.json); "
        "the passwords it already holds are kept",
    )
    acl.add_argument(
        "--rotate",
        action="store_true",
        help="make a new password for every user, whatever the credentials file holds",
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


def check_args(args: argparse.Namespace) -> None:
    """Checks that span flags, reported as argparse reports its own (exit status 2)."""
    parser: argparse.ArgumentParser = args.command_parser
    if args.command == "limits":
        both = [n for n in args.unset if getattr(args, n) is not None]
        if both:
            flag = both[0].replace("_", "-")
            parser.error(f"--{flag} and --unset {flag} contradict each other")
    if args.command == "acl" and args.admin is not None and args.admin == args.probe:
        parser.error("--admin and --probe must name different users")
    check_history(args)
