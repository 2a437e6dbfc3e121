"""The demo: agent pods (processes) share sessions while a worker summarizes.

Run it with ``make demo`` (or ``ctxstore demo``). With no
``CTXSTORE_REDIS_URL`` it starts an embedded Redis and hands its URL to the
pods and the worker. Each pod plays its own agent in every session at once
(as parallel sub-agents do): user turns, assistant messages making parallel
tool calls, tool results (some of them large logs and files) and answers.
Their writes interleave in each session's stream. Meanwhile a summary worker
(the local summarizer, or Anthropic's with ``ANTHROPIC_API_KEY`` set) keeps
each session's summary up to date, and the demo prints the summaries as they
appear. Then, per session, it checks that nothing was lost or doubled and
prints the session's stats and its request view at two budgets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import random
import sys
import time
from typing import Any

from ctxstore.embedded import shared_embedded_url
from ctxstore.policies import call_ids, result_ids
from ctxstore.settings import Settings
from ctxstore.store import ContextStore

__all__ = ["main"]

TOOLS = ("read_file", "run_tests", "grep", "list_dir")


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

    logging.basicConfig(level=logging.WARNING)
    build_worker(Settings()).run()


async def watch(tenant: str, sessions: list[str], pods: list[Any]) -> None:
    """While the pods write, print each session's size and summary as they change."""
    seen: dict[str, tuple[int, int]] = {}
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:
        while any(p.is_alive() for p in pods):
            for session in sessions:
                info = await store.info(session)
                state = (info.count, info.summary_runs)
                if info.exists and state[1] and seen.get(session, (0, 0))[1] != state[1]:
                    print(
                        f"   {session}: summary #{info.summary_runs} covers "
                        f"{info.tokens - info.tokens_unsummarized:,} of {info.tokens:,} tokens "
                        f"in {info.summary_tokens:,} ({info.summary_last_seconds or 0:.2f}s)",
                        flush=True,
                    )
                seen[session] = state
            await asyncio.sleep(0.2)


async def settle(tenant: str, sessions: list[str], limit_s: float = 60.0) -> None:
    """Wait (bounded) until no session has a summary job queued or running."""
    async with ContextStore.from_settings(Settings(), tenant=tenant) as store:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            infos = [await store.info(s) for s in sessions]
            if not any(i.summary_due for i in infos):
                return
            await asyncio.sleep(0.2)


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


def main(argv: list[str] | None = None) -> int:
    """Run the demo; the exit status is 0 when nothing was lost or doubled."""
    parser = argparse.ArgumentParser(prog="ctxstore demo", description=__doc__)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--show", type=int, default=8, help="messages shown per view")
    args = parser.parse_args(argv)
    if not os.environ.get("CTXSTORE_REDIS_URL"):
        os.environ["CTXSTORE_REDIS_URL"] = shared_embedded_url()
        print(f"embedded Redis at {os.environ['CTXSTORE_REDIS_URL']}")
    # Small enough that the demo's sessions are summarized several times.
    os.environ.setdefault("CTXSTORE_SUMMARY_TRIGGER_TOKENS", "12000")
    os.environ.setdefault("CTXSTORE_SUMMARY_KEEP_TOKENS", "4000")
    os.environ.setdefault("CTXSTORE_QUEUE_NAME", f"ctxstore:demo:{os.getpid()}")
    tenant = f"demo-{int(time.time())}"
    sessions = [f"conv-{i}" for i in range(args.sessions)]
    context = multiprocessing.get_context("spawn")
    worker = context.Process(target=_worker_process)
    worker.start()
    started = time.perf_counter()
    pods = [
        context.Process(target=_pod_process, args=(p, sessions, args.turns, args.seed, tenant))
        for p in range(args.pods)
    ]
    for pod in pods:
        pod.start()
    print(
        f"{args.pods} pods writing {args.sessions} sessions; summaries as the worker commits them:"
    )
    asyncio.run(watch(tenant, sessions, pods))
    for pod in pods:
        pod.join()
    asyncio.run(settle(tenant, sessions))
    worker.terminate()  # SIGTERM: arq lets a running job finish
    worker.join(timeout=30)
    if any(p.exitcode != 0 for p in pods):
        print("a pod failed", file=sys.stderr)
        return 1
    expected = {
        s: sum(
            len(turn) for p in range(args.pods) for turn in agent_turns(p, s, args.turns, args.seed)
        )
        for s in sessions
    }
    print(
        f"{args.pods} pods wrote {args.sessions} sessions in {time.perf_counter() - started:.1f}s "
        f"(tenant {tenant})"
    )
    ok = asyncio.run(report(tenant, sessions, expected, (2_000, 16_000), args.show))
    print("\nOK: nothing lost, nothing doubled" if ok else "\nFAILED: messages lost or doubled")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
