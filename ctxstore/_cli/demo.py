"""The demo: agent pods share on-call conversations while a worker summarizes them.

Run it with ``make demo`` (or ``ctxstore demo``). With no
``CTXSTORE_REDIS_URL`` it uses the user's embedded Redis (started if none
runs; the demo's sessions are kept for a day) and hands its URL to the pods
and the worker.

Each session is one conversation in which an agent helps an on-call engineer
move a service's database to a new Postgres cluster: the engineer's
requests (the change ticket and the maintenance window come first, a
correction later), the agent's parallel tool calls (config files, SQL, logs;
one a connection log of some 7,000 tokens) and its answers. This process is
the load balancer: it hands each turn to the next pod, so every pod serves
every conversation and all of them at once; one turn goes to two pods at
once, as a retry after a timeout would. Before each model call a pod reads
the session's view at --budget tokens, then gives the model --latency
seconds before it appends the answer the script holds. A summary worker
(the local summarizer, or Anthropic's with ANTHROPIC_API_KEY set) keeps
each session's summary up to date. Progress is shown as it happens: a bar on a terminal,
else a line at each quarter and at each summary.

Once the pods and the summary jobs are done, the demo checks each history
against its script (nothing lost or doubled, every tool result after its
call) and that no view needed a repair, then shows, on the first session:

  recall            the engineer's last question is about two rows of the
                    connection log that the view left out: the agent finds
                    them with search_history and read_entry, and answers;
  the next view     what the model gets for its next call, and the line of
                    the summary that still holds the window stated first;
  the prompt cache  the input cost per model call of ctxstore's views and of
                    plain truncation to the same budget, with cached input at
                    0.1x the price and the rest at 1.25x.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ctxstore._cli.demo_pods import Plan, Played, Pod, PodFailedError, pod_process, serve
from ctxstore._cli.demo_progress import Progress, Watch, follow_summaries
from ctxstore._cli.demo_report import Act, check_history, show_cache, show_recall, show_view
from ctxstore._cli.demo_story import Story, story
from ctxstore.errors import CtxstoreError
from ctxstore.models import SessionInfo
from ctxstore.settings import Settings
from ctxstore.store import ContextStore
from ctxstore.summarizers import summarizer_choice

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

__all__ = ["look_again", "main"]

DEMO_TTL_SECONDS = 86_400
"""The demo's sessions expire a day after their last write (unless CTXSTORE_SESSION_TTL_SECONDS)."""
RETRIED_TURN = 4
"""The turn sent to two pods at once (setting up replication: four model calls, eight messages)."""


def _worker_process() -> None:
    from workers import build_worker

    # The demo's own lines say what the worker does; its log keeps to problems.
    os.environ.setdefault("CTXSTORE_LOG_LEVEL", "WARNING")
    build_worker(Settings()).run()


@dataclass(frozen=True)
class _Outcome:
    """How the run went, as :func:`follow` saw it.

    Attributes:
        played: What the pods said of each turn, by (session, turn).
        written_s: Seconds until the last turn was played.
        settled_s: Seconds until no summary job was flagged (or the wait ended).
        pending: The sessions still flagged.
        worker_exit: The worker's exit code, if it exited before the end.
    """

    played: dict[tuple[int, int], list[Played]]
    written_s: float
    settled_s: float
    pending: list[SessionInfo]
    worker_exit: int | None


async def follow(
    tenant: str,
    stories: Sequence[Story],
    pods: Sequence[Pod],
    worker: BaseProcess | None,
    retry: tuple[int, int] | None,
    limit_s: float,
    progress: Progress,
) -> _Outcome:
    """Serve every turn to the pods, then wait for the summary jobs still flagged."""
    watch = Watch()
    started = time.monotonic()
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:
        played = await serve(store, stories, pods, retry, watch, progress)
        written_s = time.monotonic() - started
        pending: list[SessionInfo] = []
        if worker is not None:
            sessions = [s.session for s in stories]
            pending = await follow_summaries(store, sessions, worker, limit_s, watch, progress)
    progress.note(f"{watch.commits} summaries committed")
    worker_exit = None if worker is None else worker.exitcode
    elapsed = time.monotonic() - started
    return _Outcome(played, written_s, elapsed, pending, worker_exit)


async def report(
    tenant: str,
    stories: Sequence[Story],
    outcome: _Outcome,
    retry: tuple[int, int] | None,
    budget: int,
) -> tuple[bool, bool]:
    """Check each history, then show the acts on the first session.

    Returns:
        Whether every history is sound, and whether any view needed a repair.
    """
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:
        histories = {s.session: await check_history(store, s) for s in stories}
        width = max(len("session"), *(len(s.session) for s in stories))
        print(f"   {'session':<{width}}  messages   tokens  pods  summaries  lost  doubled")
        for index, conversation in enumerate(stories):
            history = histories[conversation.session]
            info = await store.info(conversation.session, pins=False)
            pods = {p.pod for (i, _), each in outcome.played.items() if i == index for p in each}
            tokens = sum(entry.tokens for entry in history.stored)
            print(
                f"   {conversation.session:<{width}}  {len(history.stored):>8}  {tokens:>7,}  "
                f"{len(pods):>4}  {info.summary_runs:>9}  {history.lost:>4}  {history.doubled:>7}"
            )
        # The model calls of each turn's first play (a retried turn's second is left out).
        calls = {
            s.session: [
                c for (i, _), each in outcome.played.items() if i == index for c in each[0].calls
            ]
            for index, s in enumerate(stories)
        }
        repaired = [r for made in calls.values() for c in made for r in c.repairs]
        misordered = sum(h.misordered for h in histories.values())
        views = sum(len(made) for made in calls.values())
        print(
            f"   every tool result was stored after its call; no view of the {views} the pods "
            "read needed a repair"
            if not (repaired or misordered)
            else f"   FAILED: {misordered} tool results stored before their call; "
            f"views needed {len(repaired)} repairs: {'; '.join(repaired[:3])}"
        )
        if retry is not None:
            twice = outcome.played[retry]
            by = " and ".join(str(pod) for pod in sorted(p.pod for p in twice))
            print(
                f"   {stories[retry[0]].session}'s turn {retry[1] + 1} went to pods {by} at once: "
                f"{sum(p.appends for p in twice)} appends, "
                f"{sum(p.duplicates for p in twice)} answered as duplicates (nothing written)"
            )
        first, act = stories[0], Act()
        print(f"\nRecall: the last question of {first.session}, about what its view left out")
        await show_recall(store, first, budget, act)
        print(f"\nWhat the model gets: the view for {first.session}'s next call")
        await show_view(store, first, budget, act)
        print("\nThe prompt cache: ctxstore's views against plain truncation to the same budget")
        show_cache(calls, histories, budget)
    return all(h.sound for h in histories.values()), bool(repaired or act.repairs)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ctxstore demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pods", type=int, default=4, help="pod processes (default 4)")
    parser.add_argument(
        "--sessions", type=int, default=3, help="conversations, played at once (default 3)"
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=4_000,
        metavar="TOKENS",
        help="the views' token budget (default 4,000: small, so the conversations outgrow it)",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="how long each model call takes: a pod waits this long before it appends the "
        "model's answer (default 0.2; real calls take seconds)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the conversations' details")
    parser.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait, once the pods are done, for the summary jobs (default 60)",
    )
    args = parser.parse_args(argv)
    if args.pods < 1 or args.sessions < 1 or args.budget < 1:
        parser.error("--pods, --sessions and --budget must be at least 1")
    if args.latency < 0:
        parser.error("--latency must be 0 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; the exit status is 0 when every check held and no job hung."""
    args = _arguments(argv)
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
    stories = [story(index, args.seed) for index in range(args.sessions)]
    retry = (min(1, args.sessions - 1), RETRIED_TURN) if args.pods > 1 else None
    calls = sum(len(t.steps) for t in stories[0].turns)
    messages = sum(len(t.messages) for t in stories[0].turns)
    summarizer = {"anthropic": "Anthropic's API", "openai": "an OpenAI-compatible API"}.get(
        summarizer_choice(settings), "the local summarizer"
    )
    print(
        f"{_count(args.pods, 'pod')}, {_count(args.sessions, 'conversation')} at once. In each, "
        "an agent helps an on-call engineer\nmove a service's database to a new Postgres cluster: "
        f"{messages} messages, {calls} model calls,\na view of {args.budget:,} tokens before "
        f"each call (tenant {tenant}).\nA worker summarizes them with {summarizer}.",
        flush=True,
    )
    context = multiprocessing.get_context("spawn")
    worker: BaseProcess | None = None
    if importlib.util.find_spec("arq") is None:
        print("no summary worker: arq is not installed (pip install '.[worker]' in the checkout)")
    else:
        worker = context.Process(target=_worker_process)
        worker.start()
    pods = []
    for pod in range(args.pods):
        orders, to_pod = context.Pipe(duplex=False)
        from_pod, replies = context.Pipe(duplex=False)
        plan = Plan(tenant, args.seed, args.budget, args.latency)
        process = context.Process(target=pod_process, args=(pod, plan, orders, replies))
        process.start()
        pods.append(Pod(process, to_pod, from_pod))
    twice = ""
    if retry is not None:
        twice = f";\nturn {retry[1] + 1} of {stories[retry[0]].session} goes to two at once, "
        twice += "as a retry after a timeout would"
    print(f"\nThe pods: each turn goes to the next one{twice}", flush=True)
    progress = Progress()
    try:
        outcome = asyncio.run(follow(tenant, stories, pods, worker, retry, args.wait, progress))
    except PodFailedError as failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        return 1
    finally:
        progress.close()
        for each in pods:
            if each.process.is_alive():
                each.orders.send(None)  # done: play nothing more
            each.process.join(timeout=30)
            if each.process.is_alive():  # only when a pod hangs
                each.process.terminate()
                each.process.join()
        if worker is not None:
            worker.terminate()  # SIGTERM: arq lets a running job finish
            worker.join(timeout=30)
    lag = outcome.settled_s - outcome.written_s
    if worker is None:
        then = ""
    elif outcome.pending:
        then = f"; {len(outcome.pending)} summary jobs were still flagged {lag:.1f} s later"
    else:
        then = f"; the last summary jobs took {lag:.1f} s more"
    total = sum(len(t.messages) for s in stories for t in s.turns)
    print(
        f"{_count(args.pods, 'pod')} wrote {total:,} messages to "
        f"{_count(args.sessions, 'session')} in "
        f"{outcome.written_s:.1f} s{then}",
        flush=True,
    )
    sound, repaired = asyncio.run(report(tenant, stories, outcome, retry, args.budget))
    print("\nOK: nothing lost, nothing doubled" if sound else "\nFAILED: messages lost or doubled")
    if repaired:
        print("FAILED: a view needed a repair: the appends were not well-formed")
    if outcome.pending:
        why = (
            f"the worker exited with code {outcome.worker_exit}"
            if outcome.worker_exit is not None
            else f"--wait {args.wait:g} s ran out"
        )
        flagged = ", ".join(info.session for info in outcome.pending)
        print(f"FAILED: summary jobs still flagged ({why}): {flagged}")
    print(f"Look again: {look_again(tenant)}")
    return 0 if sound and not repaired and not outcome.pending else 1


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


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
