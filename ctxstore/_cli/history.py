"""The ``ctxstore`` commands that move a session through its history (seed 004's ``/context``).

```
ctxstore checkpoint SESSION [--name N] | --list | --delete ID   record, list or drop checkpoints
ctxstore rewind SESSION TO              end the history at a checkpoint or an entry
ctxstore fork SESSION NEW [--at ID]     a new session from SESSION's history
ctxstore export SESSION... | --all [--out FILE] [--clear]   JSON Lines, with progress
ctxstore import FILE [--session NEW]    read an export back, all or nothing per session
ctxstore compact SESSION [--timeout S]  queue a summary now and wait for it
```

:func:`parsers` only describes them (argparse alone, so ``ctxstore --help``
stays fast); the commands import the store and rich when they run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from ctxstore.settings import Settings
    from ctxstore.store import ContextStore

__all__ = ["COMMANDS", "parsers"]

MAX_TIMEOUT = 3_600.0
"""The longest ``compact`` waits, in seconds."""
_BATCH = 32
"""Sessions whose counters an export reads at once."""


# -- the parsers ------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_TIMEOUT:g} s")
    return value


def parsers(commands: Any, command: Callable[..., argparse.ArgumentParser], common: Any) -> None:
    """Add the history commands to ``commands``.

    Args:
        commands: The subparsers.
        command: Makes a subcommand with a description and examples.
        common: ``(tenant_flag, json_flag)``, the shared flags.
    """
    tenant_flag, json_flag = common
    checkpoint = command(
        commands,
        "checkpoint",
        "record where a session is now (or list or drop its checkpoints)",
        "A checkpoint records the session's last entry, sequence number, epoch and the summary "
        "in force,\nin constant time. `ctxstore rewind` and `ctxstore fork` go back to one by its "
        "id (cp-1, cp-2...).",
        [
            "ctxstore checkpoint conv-42 --name 'before the refactor'",
            "ctxstore checkpoint conv-42 --list",
            "ctxstore checkpoint conv-42 --delete cp-3 --tenant acme",
        ],
    )
    checkpoint.add_argument("session", help="the session id (e.g. conv-42)")
    tenant_flag(checkpoint)
    what = checkpoint.add_mutually_exclusive_group()
    what.add_argument("--name", metavar="NAME", help="a name for it (e.g. 'tests pass')")
    what.add_argument("--list", action="store_true", help="list the checkpoints, oldest first")
    what.add_argument("--delete", metavar="ID", help="drop checkpoint ID (e.g. cp-3)")
    json_flag(checkpoint, "keys: tenant, session, checkpoint (or checkpoints[], or deleted)")

    rewind = command(
        commands,
        "rewind",
        "end a session's history at a checkpoint or an entry (the rest becomes a branch)",
        "For every pod at once, as a replace: the epoch grows, the summary is cut back to what "
        "the\nkept history holds, and what came after is kept, readable, as a branch until it "
        "expires.",
        ["ctxstore rewind conv-42 cp-3", "ctxstore rewind conv-42 1795473576521-0 --json"],
    )
    rewind.add_argument("session", help="the session id (e.g. conv-42)")
    rewind.add_argument("to", help="a checkpoint id (e.g. cp-3) or an entry id (e.g. 1714-0)")
    tenant_flag(rewind)
    json_flag(rewind, "keys: tenant, session, epoch, seq, count, abandoned, branch")

    fork = command(
        commands,
        "fork",
        "start a new session from a session's history",
        "The new session shares the source's history up to --at (default: its end) without "
        "copying it;\nthe two then go their own ways. Forking a 10,000-message session costs what "
        "a 100-message one does.",
        ["ctxstore fork conv-42 conv-42-try2", "ctxstore fork conv-42 conv-42-b --at cp-2"],
    )
    fork.add_argument("session", help="the source session's id (e.g. conv-42)")
    fork.add_argument("new", help="the new session's id; it must not exist (e.g. conv-42-b)")
    fork.add_argument("--at", metavar="ID", help="a checkpoint id (e.g. cp-2) or an entry id")
    tenant_flag(fork)
    json_flag(fork, "keys: every ForkResult field, tenant")

    export = command(
        commands,
        "export",
        "write sessions as JSON Lines (one session, a list, or a whole tenant)",
        "Messages as stored, with entry ids, pins, the summary and the checkpoints, a page at a "
        "time\n(memory does not grow with the history). Sealed messages stay sealed unless "
        "--clear (the key\nmust be configured). A progress bar on stderr; the lines go to --out "
        "or stdout.",
        [
            "ctxstore export conv-42 --out conv-42.jsonl",
            "ctxstore export --all --tenant acme --out acme.jsonl",
            "ctxstore export conv-42 conv-43 --clear > both.jsonl",
        ],
    )
    export.add_argument("sessions", nargs="*", metavar="SESSION", help="the sessions to export")
    export.add_argument("--all", action="store_true", help="every session of the tenant")
    export.add_argument("--out", metavar="FILE", help="the file to write (default: stdout)")
    export.add_argument(
        "--clear", action="store_true", help="write sealed messages in clear (needs the key)"
    )
    tenant_flag(export)

    read_in = command(
        commands,
        "import",
        "read an export back, into this deployment, tenant or session id",
        "Each session appears whole at its end line, or not at all: a malformed line is refused "
        "with\nits number and nothing of its session is written. Importing the same export "
        "twice changes\nnothing. Sealed messages need their key in CTXSTORE_ENCRYPTION_KEYS.",
        [
            "ctxstore import conv-42.jsonl",
            "ctxstore import conv-42.jsonl --tenant acme --session conv-42-restored",
            "ctxstore import - < acme.jsonl",
        ],
    )
    read_in.add_argument("file", metavar="FILE", help="the export to read ('-': stdin)")
    read_in.add_argument("--session", metavar="NEW", help="the id to import its one session under")
    tenant_flag(read_in)
    json_flag(read_in, "keys: tenant, sessions[]: session, status, count, checkpoints, source")

    compact = command(
        commands,
        "compact",
        "queue a summary of a session now, and wait for a worker to write it",
        "Queues the session's summary whether or not one is due, then waits (with progress) "
        "for a\nworker (`ctxstore worker`) to commit it: exit 0 when it did (or found nothing "
        "to summarize),\n1 when the job failed or --timeout passed.",
        ["ctxstore compact conv-42", "ctxstore compact conv-42 --timeout 120 --json"],
    )
    compact.add_argument("session", help="the session id (e.g. conv-42)")
    compact.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help=f"give up after this long, in seconds (default 60, at most {MAX_TIMEOUT:g})",
    )
    tenant_flag(compact)
    json_flag(compact, "keys: tenant, session, outcome, summary_covers, seconds")


def check(args: argparse.Namespace) -> None:
    """Checks that span flags, reported as argparse reports its own."""
    if args.command == "export" and bool(args.sessions) == bool(args.all):
        args.command_parser.error("name the sessions to export, or --all (not both)")


# -- the commands -------------------------------------------------------------------


def _store(settings: Settings, tenant: str | None) -> ContextStore:
    from ctxstore.store import ContextStore

    return ContextStore.from_settings(settings, tenant=tenant)


async def _checkpoint(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import emit_json

    async with _store(settings, args.tenant) as store:
        tenant = store.tenant
        if args.list:
            points = await store.checkpoints(args.session)
            if args.json:
                emit_json(
                    {
                        "tenant": tenant,
                        "session": args.session,
                        "checkpoints": [asdict(p) for p in points],
                    }
                )
            else:
                _show_checkpoints(tenant, args.session, points)
            return 0
        if args.delete is not None:
            deleted = await store.delete_checkpoint(args.session, args.delete)
            if args.json:
                emit_json({"tenant": tenant, "session": args.session, "deleted": deleted})
            else:
                print(f"{args.delete} {'deleted' if deleted else 'was not there'}")
            return 0 if deleted else 1
        point = await store.checkpoint(args.session, args.name)
    if args.json:
        emit_json({"tenant": tenant, "session": args.session, "checkpoint": asdict(point)})
    else:
        print(
            f"checkpoint {point.checkpoint_id} of session {args.session!r}: {point.count:,} "
            f"messages, {point.tokens:,} tokens, "
            + (f"summary to {point.summary_covers}" if point.summary_covers else "no summary")
        )
    return 0


def _show_checkpoints(tenant: str, session: str, points: list[Any]) -> None:
    from ctxstore._cli.render import _table, show, when

    if not points:
        print(f"session {session!r} of tenant {tenant!r} has no checkpoints")
        return
    table = _table(
        f"checkpoints of session {session!r} of tenant {tenant!r}",
        "id",
        "name",
        "messages",
        "tokens",
        "summary",
        "made",
        "where",
        right=("messages", "tokens"),
    )
    for p in points:
        table.add_row(
            p.checkpoint_id,
            p.name or "-",
            f"{p.count:,}",
            f"{p.tokens:,}",
            "yes" if p.summary_covers else "-",
            when(p.created_ms),
            f"branch {p.branch}" if p.branch else "history",
        )
    show(table)


async def _rewind(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import emit_json

    async with _store(settings, args.tenant) as store:
        result = await store.rewind(args.session, args.to)
        tenant = store.tenant
    if args.json:
        emit_json({"tenant": tenant, "session": args.session, **asdict(result)})
    elif result.branch is None:
        print(f"session {args.session!r} already ends at {args.to}: nothing changed")
    else:
        print(
            f"rewound session {args.session!r} to {args.to}: {result.count:,} messages now; "
            f"{result.abandoned:,} kept as branch {result.branch} (epoch {result.epoch})"
        )
    return 0


async def _fork(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import emit_json

    async with _store(settings, args.tenant) as store:
        result = await store.fork(args.session, args.new, at=args.at)
        tenant = store.tenant
    if args.json:
        emit_json({"tenant": tenant, **asdict(result)})
    else:
        print(
            f"forked session {args.session!r} into {args.new!r} at {result.at or 'its start'}: "
            f"{result.count:,} messages ({result.copied:,} copied, the rest shared)"
        )
    return 0


async def _export(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import progress

    async with _store(settings, args.tenant) as store:
        if args.all:  # those the index lists that still exist (not expired since)
            infos = [i for i in await _counts(store, await store._index.members()) if i.exists]
        else:
            infos = await _counts(store, list(args.sessions), must_exist=True)
        sessions = [info.session for info in infos]
        total = sum(info.count for info in infos)
        messages = 0
        with _output(args.out) as write, progress("exporting", total) as advance:
            for session in sessions:
                async for line in store.export_session(session, clear=args.clear):
                    write(line + "\n")
                    if line.startswith('{"ctxstore":"message"'):
                        messages += 1
                        advance(1)
        tenant = store.tenant
    where = args.out or "stdout"
    plural = "" if len(sessions) == 1 else "s"
    print(
        f"exported {len(sessions):,} session{plural} of tenant {tenant!r}, {messages:,} messages, "
        f"to {where}",
        file=sys.stderr,
    )
    return 0


async def _counts(
    store: ContextStore, sessions: list[str], *, must_exist: bool = False
) -> list[Any]:
    """Each session's counters, a batch of round trips at a time.

    Raises:
        SessionNotFoundError: One does not exist (with ``must_exist``).
    """
    from ctxstore.errors import SessionNotFoundError

    infos: list[Any] = []
    for start in range(0, len(sessions), _BATCH):
        batch = sessions[start : start + _BATCH]
        infos += await asyncio.gather(*(store.info(s, pins=False) for s in batch))
    for info in infos:
        if must_exist and not info.exists:
            raise SessionNotFoundError("no such session", tenant=store.tenant, session=info.session)
    return infos


@contextmanager
def _output(path: str | None) -> Iterator[Callable[[str], object]]:
    """Writes text to the file (created or truncated, mode 0600), or to stdout, as UTF-8.

    An export holds what the sessions hold: only the user who wrote it may read it.
    An existing file is set to that mode before anything is written. The lines are
    UTF-8 whatever the terminal's encoding (an export's format says so).

    Raises:
        InvalidInputError: The file cannot be created or written (a closed stdout
            is a BrokenPipeError, which ends the command quietly).
    """
    from ctxstore.errors import InvalidInputError

    where = path or "stdout"

    def failed(exc: OSError) -> InvalidInputError:
        return InvalidInputError(f"cannot write {where}: {exc.strerror or exc}")

    if path is None:
        sys.stdout.flush()
        stream = getattr(sys.stdout, "buffer", None)  # None: a stdout with no bytes under it
    else:
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise failed(exc) from exc
        try:
            if stat.S_ISREG(os.fstat(descriptor).st_mode):  # not a terminal's, a pipe's
                os.fchmod(descriptor, 0o600)  # an existing file keeps its mode otherwise
        except OSError as exc:
            os.close(descriptor)
            raise failed(exc) from exc
        stream = os.fdopen(descriptor, "wb")

    def write(text: str) -> None:
        try:
            if stream is None:
                sys.stdout.write(text)
            else:
                stream.write(text.encode())
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise failed(exc) from exc

    try:
        yield write
        try:
            (sys.stdout if stream is None else stream).flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise failed(exc) from exc
    finally:
        if path is not None and stream is not None:
            with suppress(OSError):  # what it could not write is reported above
                stream.close()


async def _import(settings: Settings, args: argparse.Namespace) -> int:
    from ctxstore._cli.render import emit_json, progress

    with _input(args.file) as (source, size), progress("importing", size or 1) as advance:

        def lines() -> Iterator[str]:
            for line in source:
                advance(len(line))
                # Bytes that are not UTF-8 become lone surrogates, which the import
                # refuses naming the line (a decode error here could name none).
                yield line.decode("utf-8", "surrogateescape")

        async with _store(settings, args.tenant) as store:
            results = await store.import_sessions(lines(), session=args.session)
            tenant = store.tenant
    if args.json:
        emit_json({"tenant": tenant, "sessions": [asdict(r) for r in results]})
        return 0
    for r in results:
        print(
            f"{r.status} session {r.session!r} of tenant {tenant!r} (from {r.source}): "
            f"{r.count:,} messages, {r.checkpoints} checkpoints"
        )
    return 0


@contextmanager
def _input(path: str) -> Iterator[tuple[Iterator[bytes], int]]:
    """The file's lines, as bytes, and its size (stdin for ``-``, of unknown size: 0).

    Raises:
        InvalidInputError: It cannot be opened or read.
    """
    from ctxstore.errors import InvalidInputError

    where = "stdin" if path == "-" else path

    def read(source: BinaryIO) -> Iterator[bytes]:
        try:
            yield from source
        except OSError as exc:
            raise InvalidInputError(f"cannot read {where}: {exc.strerror or exc}") from exc

    if path == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        if stdin is None:  # closed (`<&-`), or text with no bytes under it
            raise InvalidInputError("cannot read stdin: it is closed")
        yield read(stdin), 0
        return
    try:
        source = open(path, "rb")  # noqa: SIM115 - closed below
        size = os.fstat(source.fileno()).st_size
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror}") from exc
    with source:
        yield read(source), size


async def _compact(settings: Settings, args: argparse.Namespace) -> int:
    from rich.console import Console

    from ctxstore._cli.render import emit_json
    from ctxstore.summary_queue import SummaryQueue

    started = time.monotonic()
    async with _store(settings, args.tenant) as store:
        before = (await _counts(store, [args.session], must_exist=True))[0]
        generation = await store.request_summary(args.session, force=True)
        queue = await SummaryQueue.connect(settings)
        try:
            await queue.enqueue(store.tenant, args.session, generation)
            console = Console(stderr=True)
            with console.status("queued", spinner="dots") as shown:
                info = before
                while time.monotonic() - started < args.timeout:
                    info = await store.info(args.session, pins=False)
                    if _finished(before, info):
                        break
                    state = await queue.status(store.tenant, args.session, generation)
                    shown.update(f"summary of {args.session!r}: {state}")
                    await asyncio.sleep(0.2)  # the worker's progress: polled, nothing waits on it
                else:
                    from ctxstore.errors import CtxstoreError

                    raise CtxstoreError(
                        f"no worker wrote the summary of {args.session!r} within "
                        f"{args.timeout:g} s (is `ctxstore worker` running?); it stays queued"
                    )
        finally:
            await queue.aclose()
        tenant = store.tenant
    seconds = round(time.monotonic() - started, 3)
    # Another job of the session (queued by its appends) may end after the one that
    # committed, with nothing left to do: the summary moved, and that is the outcome.
    moved = info.summary_covers is not None and info.summary_covers != before.summary_covers
    outcome = "committed" if moved else info.summary_last_outcome or "-"
    if args.json:
        emit_json(
            {
                "tenant": tenant,
                "session": args.session,
                "outcome": outcome,
                "summary_covers": info.summary_covers,
                "summary_tokens": info.summary_tokens,
                "tokens_unsummarized": info.tokens_unsummarized,
                "seconds": seconds,
            }
        )
    elif outcome == "idle":  # the worker found nothing older than what a summary leaves raw
        print(
            f"nothing to summarize in session {args.session!r} ({info.tokens:,} tokens, "
            f"{info.tokens - info.tokens_unsummarized:,} summarized): a summary leaves the "
            f"newest up to {settings.summary_keep_tokens:,} tokens raw "
            "(CTXSTORE_SUMMARY_KEEP_TOKENS) and covers what is older; one is due on its own "
            f"{settings.summary_trigger_tokens:,} tokens past the last "
            "(CTXSTORE_SUMMARY_TRIGGER_TOKENS)"
        )
    else:
        print(
            f"summary of session {args.session!r}: {outcome} in {seconds:.1f} s; it covers "
            f"{info.tokens - info.tokens_unsummarized:,} of {info.tokens:,} tokens "
            f"in {info.summary_tokens:,}"
        )
    return 0 if outcome != "failed" else 1


def _finished(before: Any, now: Any) -> bool:
    """True once a job ended after the request (committed, idle or failed)."""
    return (now.summary_last_at_ms or 0) > (before.summary_last_at_ms or 0) or (
        now.summary_runs + now.summary_failures > before.summary_runs + before.summary_failures
    )


COMMANDS = {
    "checkpoint": _checkpoint,
    "rewind": _rewind,
    "fork": _fork,
    "export": _export,
    "import": _import,
    "compact": _compact,
}
"""Each history command, by name."""
