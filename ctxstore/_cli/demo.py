"""The demo: agent pods (processes) share sessions while a worker summarizes.

Run it with ``make demo`` (or ``ctxstore demo``). With no
``CTXSTORE_REDIS_URL`` it uses the user's embedded Redis (started if none
runs; the demo's sessions are kept for a day) and hands its URL to the pods
and the worker. Each pod plays its own agent in every session at once (as
parallel sub-agents do): user turns, assistant messages making parallel tool
calls, tool results (some of them large logs and files) and answers. Their
writes interleave in each session's stream. Meanwhile a summary worker (the
local summarizer, or Anthropic's with ``ANTHROPIC_API_KEY`` set) keeps each
session's summary up to date. Progress is shown as it happens: a bar on a
terminal, else a line at each quarter and at each summary. Once the pods
are done the demo waits for the summary jobs still flagged, then, per
session, checks that nothing was lost or doubled and prints the session's
stats and its request view at two budgets.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxstore._layout.formats import call_ids, result_ids
from ctxstore.errors import CtxstoreError
from ctxstore.models import SessionInfo, SummaryStatus
from ctxstore.settings import Settings
from ctxstore.store import ContextStore

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["main"]

TOOLS = ("read_file", "run_tests", "grep", "list_dir")
DEMO_TTL_SECONDS = 86_400
"""The demo's sessions expire a day after their last write (unless CTXSTORE_SESSION_TTL_SECONDS)."""
_TICK = 0.2
"""Seconds between two looks at the sessions while nothing else happens."""


def agent_turns(pod: int, session: str, turns: int, seed: int) -> list[list[dict[str, Any]]]:
    """One pod's part of a session: a list of turns, each a list of messages."""
    rng = random.Random(f"{seed}:{pod}:{session}")
    out = []
    for turn in range(turns):
        tag = f"p{pod}t{turn}"
        messages: list[dict[str, Any]] = [
            {
                "role": "user",
                "content": f"[pod {pod}] step {turn}: check module_{rng.randint(1, 99)}.py",
            }
        ]
        calls: list[dict[str, Any]] = [
            {
                "id": f"call_{session}_{tag}_{i}",
                "type": "function",
                "function": {
                    "name": rng.choice(TOOLS),
                    "arguments": json.dumps({"path": f"src/module_{rng.randint(1, 99)}.py"}),
                },
            }
            for i in range(rng.randint(1, 3))
        ]
        messages.append({"role": "assistant", "content": f"Checking ({tag}).", "tool_calls": calls})
        for call in calls:
            size = rng.choice((1, 1, 2, 40)) * 200  # now and then a large output
            body = "\n".join(
                f"{call['function']['name']} line {n}: ok value={rng.randint(0, 10**6)}"
                for n in range(size // 10)
            )
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": body})
        messages.append(
            {"role": "assistant", "content": f"Step {turn} done on pod {pod}: all good."}
        )
        out.append(messages)
    return out


async def pod_main(pod: int, sessions: list[str], turns: int, seed: int, tenant: str) -> int:
    """Append this pod's turns to every session at once; return messages written.

    Sessions advance concurrently, and the results of parallel tool calls are
    appended concurrently, as a pod running tools in parallel would.
    """
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:

        async def play(session: str) -> int:
            written = 0
            for messages in agent_turns(pod, session, turns, seed):
                user, ask, *results, answer = messages
                await store.append(session, user)
                await store.append(session, ask)
                await asyncio.gather(*(store.append(session, r) for r in results))
                await store.append(session, answer)
                written += len(messages)
            return written

        return sum(await asyncio.gather(*(play(s) for s in sessions)))


def _pod_process(pod: int, sessions: list[str], turns: int, seed: int, tenant: str) -> None:
    asyncio.run(pod_main(pod, sessions, turns, seed, tenant))


def _worker_process() -> None:
    from workers import build_worker

    # The demo's own lines say what the worker does; its log keeps to problems.
    os.environ.setdefault("CTXSTORE_LOG_LEVEL", "WARNING")
    build_worker(Settings()).run()


class _Progress:
    """What the demo is doing, as it happens.

    On a terminal (``console``, else stdout's): a rich progress bar per
    phase, with notes printed above it. Elsewhere (a pipe, a log, CI): a
    line when a phase reaches each quarter or its detail changes, and a
    line per note; every line is stamped with the seconds since the start.
    """

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self._console = console or Console()
        self._started = time.monotonic()
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._unit = ""
        self._total = 1
        self._printed: tuple[int, str] | None = None
        if self._console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description:<12}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[detail]}"),
                console=self._console,
            )
            self._bar.start()

    def phase(self, label: str, total: int, unit: str) -> None:
        """Start a phase of ``total`` steps, counted in ``unit``."""
        self._label, self._total, self._unit = label, max(total, 1), unit
        self._printed = None
        if self._bar is not None:
            if self._task is not None:
                self._bar.stop_task(self._task)
            self._task = self._bar.add_task(label, total=total, unit=unit, detail="")

    def update(self, done: int, detail: str = "") -> None:
        """``done`` steps of the phase are done; ``detail`` says what it waits for."""
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, detail=detail)
            return
        quarter = min(4, 4 * done // self._total)
        if (quarter, detail) != self._printed:
            self._printed = (quarter, detail)
            percent = min(100, 100 * done // self._total)
            waiting = f"; {detail}" if detail else ""
            self.note(f"{self._label}: {done:,}/{self._total:,} {self._unit} ({percent}%){waiting}")

    def note(self, text: str) -> None:
        """Print one line (above the bar, on a terminal)."""
        line = f"[{time.monotonic() - self._started:5.1f} s] {text}"
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, flush=True)

    def close(self) -> None:
        """Leave the bar as it last was."""
        if self._bar is not None:
            self._bar.stop()


@dataclass
class _Watch:
    """The sessions as last seen, to say what changed in each since."""

    seen: dict[str, SessionInfo] = field(default_factory=dict)

    def changes(self, info: SessionInfo) -> list[str]:
        """What happened to the session since the last look, one line per event."""
        before = self.seen.get(info.session) or SessionInfo(info.tenant, info.session, False)
        self.seen[info.session] = info
        lines = []
        name = info.session
        if info.summary_runs > before.summary_runs:
            covered = info.tokens - info.tokens_unsummarized
            lines.append(
                f"{name}: summary #{info.summary_runs} covers {covered:,} of {info.tokens:,} "
                f"tokens in {info.summary_tokens:,} ({info.summary_last_seconds or 0:.2f} s)"
            )
        elif info.summary_failures > before.summary_failures:
            lines.append(f"{name}: summary job failed: {info.summary_error}")
        elif (
            info.summary_last_at_ms != before.summary_last_at_ms
            and info.summary_last_outcome == SummaryStatus.IDLE
        ):
            lines.append(
                f"{name}: summary job idle, no cut point yet; "
                "an append that makes one queues another"
            )
        return lines

    @property
    def commits(self) -> int:
        """Summaries committed in all the sessions seen."""
        return sum(info.summary_runs for info in self.seen.values())


async def _look(
    store: ContextStore, sessions: Sequence[str], watch: _Watch, progress: _Progress
) -> list[SessionInfo]:
    """Read every session's counters; note what changed."""
    infos = await asyncio.gather(*(store.info(session) for session in sessions))
    for info in infos:
        for line in watch.changes(info):
            progress.note(line)
    return list(infos)


async def _wait_for_exit(processes: Sequence[BaseProcess]) -> None:
    """Return when one of ``processes`` exits, or after a tick (to look again)."""
    live = [process.sentinel for process in processes if process.is_alive()]
    if live:
        await asyncio.to_thread(multiprocessing.connection.wait, live, _TICK)


async def follow_writes(
    store: ContextStore,
    sessions: Sequence[str],
    pods: Sequence[BaseProcess],
    total: int,
    watch: _Watch,
    progress: _Progress,
) -> None:
    """Show the messages stored and the summaries committed until every pod has exited."""
    progress.phase("writing", total, "messages")
    while True:
        infos = await _look(store, sessions, watch, progress)
        progress.update(sum(info.count for info in infos))
        if not any(pod.is_alive() for pod in pods):
            return
        await _wait_for_exit(pods)


async def follow_summaries(
    store: ContextStore,
    sessions: Sequence[str],
    worker: BaseProcess,
    limit_s: float,
    watch: _Watch,
    progress: _Progress,
) -> list[SessionInfo]:
    """Wait until no session has a summary job flagged; return those still flagged.

    Some are left only if the worker exited, or ``limit_s`` seconds passed.
    """
    deadline = time.monotonic() + limit_s
    progress.phase("summarizing", len(sessions), "sessions done")
    while True:
        infos = await _look(store, sessions, watch, progress)
        pending = [info for info in infos if info.summary_due]
        waiting = ", ".join(info.session for info in pending)
        progress.update(len(infos) - len(pending), f"waiting for {waiting}" if pending else "")
        if not pending or not worker.is_alive() or time.monotonic() > deadline:
            return pending
        await _wait_for_exit([worker])


@dataclass(frozen=True)
class _Outcome:
    """How the run went, as :func:`follow` saw it.

    Attributes:
        written_s: Seconds until the last pod exited.
        settled_s: Seconds until no summary job was flagged (or the wait ended).
        pending: The sessions still flagged.
        worker_exit: The worker's exit code, if it exited before the end.
    """

    written_s: float
    settled_s: float
    pending: list[SessionInfo]
    worker_exit: int | None


async def follow(
    tenant: str,
    sessions: Sequence[str],
    pods: Sequence[BaseProcess],
    worker: BaseProcess | None,
    total: int,
    limit_s: float,
    progress: _Progress,
) -> _Outcome:
    """Follow the pods, then the summary jobs still flagged."""
    watch = _Watch()
    started = time.monotonic()
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:
        await follow_writes(store, sessions, pods, total, watch, progress)
        written_s = time.monotonic() - started
        pending: list[SessionInfo] = []
        if worker is not None:
            pending = await follow_summaries(store, sessions, worker, limit_s, watch, progress)
    progress.note(f"{watch.commits} summaries committed")
    worker_exit = None if worker is None else worker.exitcode
    return _Outcome(written_s, time.monotonic() - started, pending, worker_exit)


def _describe(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(b.get("text", b.get("type"))) for b in content)
    text = (content or "").replace("\n", " ")
    calls = call_ids(message)
    answers = result_ids(message)
    extra = f" calls={len(calls)}" if calls else (f" answers={answers[0][-8:]}" if answers else "")
    return f"{message['role']:>9}{extra}: {text[:64]}"


async def report(
    tenant: str, sessions: list[str], expected: dict[str, int], budgets: tuple[int, ...], show: int
) -> bool:
    """Print each session's stats and views; return True if nothing was lost or doubled."""
    ok = True
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:
        for session in sessions:
            info = await store.info(session)
            history = await store.get_messages(session)
            keys = [json.dumps(m, sort_keys=True) for m in history]
            doubled = len(keys) - len(set(keys))
            lost = expected[session] - len(set(keys))
            ok = ok and lost == 0 and doubled == 0
            print(f"\n== session {session}")
            print(
                f"   {info.count} messages, {info.tokens:,} tokens, epoch {info.epoch}; "
                f"lost {lost}, doubled {doubled}"
            )
            print(
                f"   summary: {info.summary_runs} commits by {info.summary_model or '-'}, "
                f"covers {info.tokens - info.tokens_unsummarized:,} tokens in "
                f"{info.summary_tokens:,} (saves {info.tokens_saved:,}); "
                f"{info.tokens_unsummarized:,} tokens past it"
            )
            for budget in budgets:
                view = await store.view(session, token_budget=budget)
                st = view.stats
                print(
                    f"-- view at {budget:,} tokens: {st.messages} messages, {st.tokens:,} tokens, "
                    f"dropped {st.dropped}, offloaded {len(st.offloaded)}, "
                    f"repairs {len(st.repairs)}, summary {'yes' if st.summary_used else 'no'}"
                )
                shown = view.messages if len(view.messages) <= show else view.messages[-show:]
                if len(view.messages) > show:
                    print(f"     ... {len(view.messages) - show} earlier messages")
                for message in shown:
                    print("     " + _describe(message))
    return ok


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ctxstore demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pods", type=int, default=4, help="pod processes (default 4)")
    parser.add_argument("--sessions", type=int, default=3, help="sessions (default 3)")
    parser.add_argument("--turns", type=int, default=10, help="turns per pod and session")
    parser.add_argument("--seed", type=int, default=7, help="seed of the conversations")
    parser.add_argument("--show", type=int, default=8, help="messages shown per view")
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait, once the pods are done, for the summary jobs (default 60)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; the exit status is 0 when nothing was lost or doubled and no job hung."""
    args = _arguments(argv)
    # Small enough that the demo's sessions are summarized several times.
    os.environ.setdefault("CTXSTORE_SUMMARY_TRIGGER_TOKENS", "12000")
    os.environ.setdefault("CTXSTORE_SUMMARY_KEEP_TOKENS", "4000")
    os.environ.setdefault("CTXSTORE_QUEUE_NAME", f"ctxstore:demo:{os.getpid()}")
    # The embedded Redis keeps its data: the demo's sessions go after a day.
    os.environ.setdefault("CTXSTORE_SESSION_TTL_SECONDS", str(DEMO_TTL_SECONDS))
    try:
        settings = Settings()
        if settings.redis_url is None:
            # The pods and the worker are handed the server this process found.
            os.environ["CTXSTORE_REDIS_URL"] = settings.store_url()
    except CtxstoreError as exc:
        print(f"ctxstore demo: {exc}", file=sys.stderr)
        return 2
    tenant = f"demo-{int(time.time())}-{os.getpid()}"
    sessions = [f"conv-{i}" for i in range(args.sessions)]
    expected = {
        s: sum(
            len(turn) for p in range(args.pods) for turn in agent_turns(p, s, args.turns, args.seed)
        )
        for s in sessions
    }
    total = sum(expected.values())
    choice = settings.summarizer
    if choice == "auto":
        choice = "anthropic" if settings.anthropic_api_key is not None else "local"
    summarizer = {"anthropic": "Anthropic's API", "openai": "an OpenAI-compatible API"}.get(
        choice, "the local summarizer"
    )
    print(
        f"{args.pods} pods write {args.turns} turns each to {args.sessions} sessions "
        f"({total:,} messages, tenant {tenant}); a worker summarizes them with {summarizer}",
        flush=True,
    )
    context = multiprocessing.get_context("spawn")
    worker: BaseProcess | None = None
    if importlib.util.find_spec("arq") is None:
        print("no summary worker: arq is not installed (pip install '.[worker]' in the checkout)")
    else:
        worker = context.Process(target=_worker_process)
        worker.start()
    pods = [
        context.Process(target=_pod_process, args=(p, sessions, args.turns, args.seed, tenant))
        for p in range(args.pods)
    ]
    for pod in pods:
        pod.start()
    progress = _Progress()
    try:
        outcome = asyncio.run(follow(tenant, sessions, pods, worker, total, args.wait, progress))
    finally:
        progress.close()
        for pod in pods:
            if pod.is_alive():  # only when following failed: the pods are done by now
                pod.terminate()
            pod.join()
        if worker is not None:
            worker.terminate()  # SIGTERM: arq lets a running job finish
            worker.join(timeout=30)
    if any(p.exitcode != 0 for p in pods):
        print("FAILED: a pod failed", file=sys.stderr)
        return 1
    lag = outcome.settled_s - outcome.written_s
    if worker is None:
        then = ""
    elif outcome.pending:
        then = f"; {len(outcome.pending)} summary jobs were still flagged {lag:.1f} s later"
    else:
        then = f"; the last summary jobs took {lag:.1f} s more"
    print(
        f"{args.pods} pods wrote {total:,} messages to {args.sessions} sessions in "
        f"{outcome.written_s:.1f} s{then}",
        flush=True,
    )
    ok = asyncio.run(report(tenant, sessions, expected, (2_000, 16_000), args.show))
    print("\nOK: nothing lost, nothing doubled" if ok else "\nFAILED: messages lost or doubled")
    if outcome.pending:
        why = (
            f"the worker exited with code {outcome.worker_exit}"
            if outcome.worker_exit is not None
            else f"--wait {args.wait:g} s ran out"
        )
        flagged = ", ".join(info.session for info in outcome.pending)
        print(f"FAILED: summary jobs still flagged ({why}): {flagged}")
    print(f"Look again: {look_again(tenant)}")
    return 0 if ok and not outcome.pending else 1


def look_again(tenant: str, *, path: str | None = None) -> str:
    """The command that lists the demo's sessions, as it runs from here.

    ``make demo`` runs ``.venv/bin/ctxstore``, which is on no ``PATH`` until
    the virtualenv is activated: the bare name is given only where it finds
    this very script (``path``: the ``PATH`` to search; the process's own by
    default).
    """
    script = Path(sys.executable).with_name("ctxstore")  # beside the interpreter, unresolved
    found = shutil.which("ctxstore", path=path)
    command = f"sessions --tenant {tenant}"
    if not script.is_file() or (found is not None and os.path.samefile(found, script)):
        return f"ctxstore {command}"
    activate = script.with_name("activate")
    if not activate.is_file():
        return f"{_from_here(script)} {command}"
    return (
        f"{_from_here(script)} {command} (or `source {_from_here(activate)}` first: "
        "then `ctxstore` is on your PATH)"
    )


def _from_here(file: Path) -> str:
    """``file`` relative to the working directory when it is under it, else absolute."""
    try:
        return str(file.relative_to(Path.cwd()))
    except ValueError:
        return str(file)


if __name__ == "__main__":
    sys.exit(main())
