"""The demo's agent pods, and the load balancer in front of them.

Each pod is a process with its own store, as a stateless agent pod behind a
load balancer is: it plays whatever turn it is handed, of any session, many
at once. A turn is the user's message, then each model call's step: the pod
reads the session's view (the model's input), gives the model its latency,
appends the assistant's message the script holds, then the results of the
tools it called, at once (as parallel tool calls finish). Every append
carries an idempotency key of its own, so a turn played twice is stored
once. The balancer (:func:`serve`, in the demo's process) hands each
session's next turn to the next pod once the previous turn is done, and one
turn to two pods at once, as a retry after a timeout would.
"""

from __future__ import annotations

import asyncio
import multiprocessing.connection
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ctxstore import ContextStore, Settings, TiktokenCounter, count_message
from ctxstore._cli.demo_progress import TICK, Progress, Watch, look
from ctxstore._cli.demo_report import ModelCall, fingerprint
from ctxstore._cli.demo_story import Story, story

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

__all__ = ["Plan", "Played", "Pod", "PodFailedError", "pod_process", "serve"]


@dataclass(frozen=True)
class Played:
    """What a pod says of a turn it played.

    Attributes:
        session: The conversation's index.
        turn: The turn's index.
        pod: The pod that played it.
        appends: The appends it sent.
        duplicates: Of them, those the store answered as duplicates (nothing written).
        calls: The model calls it made, with the input each sent.
    """

    session: int
    turn: int
    pod: int
    appends: int
    duplicates: int
    calls: tuple[ModelCall, ...]


@dataclass(frozen=True)
class Plan:
    """What every pod is told when it starts.

    Attributes:
        tenant: The demo's tenant.
        seed: The conversations' seed.
        budget: The views' token budget.
        latency: Seconds a model call takes: a pod waits this long after
            reading a view, before it appends the model's answer.
    """

    tenant: str
    seed: int
    budget: int
    latency: float


def pod_process(pod: int, plan: Plan, orders: Connection, replies: Connection) -> None:
    """A pod's process: play the turns ``orders`` hands it until it hands ``None``."""
    asyncio.run(_pod_main(pod, plan, orders, replies))


async def _pod_main(pod: int, plan: Plan, orders: Connection, replies: Connection) -> None:
    stories: dict[int, Story] = {}
    sizes: dict[str, int] = {}
    running: set[asyncio.Task[Played]] = set()

    def reply(task: asyncio.Task[Played]) -> None:
        running.discard(task)
        failed = task.exception()
        replies.send(f"pod {pod}: {failed!r}" if failed is not None else task.result())

    async with ContextStore.from_settings(Settings(), tenant=plan.tenant) as store:
        while True:
            try:
                order = await asyncio.to_thread(orders.recv)
            except EOFError:  # the demo's process is gone
                order = None
            if order is None:
                break
            index, turn = order
            if index not in stories:
                stories[index] = story(index, plan.seed)
            task = asyncio.create_task(_play(store, stories[index], index, turn, pod, plan, sizes))
            running.add(task)
            task.add_done_callback(reply)
        await asyncio.gather(*running, return_exceptions=True)


async def _play(
    store: ContextStore,
    conversation: Story,
    index: int,
    turn: int,
    pod: int,
    plan: Plan,
    sizes: dict[str, int],
) -> Played:
    """Play one turn: append the user's message, then for each step read a view and append."""
    session, played = conversation.session, conversation.turns[turn]
    sent = duplicates = 0
    counter = TiktokenCounter()

    async def put(n: int, message: dict[str, object]) -> None:
        nonlocal sent, duplicates
        result = await store.append(session, message, idempotency_key=f"turn-{turn}-{n}")
        sent, duplicates = sent + 1, duplicates + result.duplicate

    def size(message: dict[str, object]) -> tuple[str, int]:
        key = fingerprint(message)
        if key not in sizes:
            sizes[key] = count_message(counter, message)
        return key, sizes[key]

    n = 0
    for message in (*played.opening, played.user):
        await put(n, message)
        n += 1
    calls = []
    for step_index, step in enumerate(played.steps):
        view = await store.view(session, token_budget=plan.budget)  # the model call's input
        sent_now = tuple(size(m) for m in view.messages)
        stats = view.stats
        calls.append(
            ModelCall(turn, step_index, sent_now, stats.history_messages, tuple(stats.repairs))
        )
        await asyncio.sleep(plan.latency)  # the model at work (it answers what the story says)
        await put(n, step.assistant)
        await asyncio.gather(*(put(n + 1 + k, r) for k, r in enumerate(step.results)))
        n += 1 + len(step.results)
    return Played(index, turn, pod, sent, duplicates, tuple(calls))


class PodFailedError(Exception):
    """A pod failed a turn, or exited before the end."""


@dataclass
class Pod:
    """A pod's process, as the balancer holds it.

    Attributes:
        process: The pod's process.
        orders: Where the balancer sends it turns, as ``(session, turn)``, then ``None``.
        replies: Where it answers, a :class:`Played` per turn (or why it failed).
    """

    process: BaseProcess
    orders: Connection
    replies: Connection


async def serve(
    store: ContextStore,
    stories: Sequence[Story],
    pods: Sequence[Pod],
    retry: tuple[int, int] | None,
    watch: Watch,
    progress: Progress,
) -> dict[tuple[int, int], list[Played]]:
    """Hand every turn of every session to the pods; return what they played, by (session, turn).

    Each session's turns go one after the other, turn ``t`` of session ``s``
    to pod ``(s + t) % len(pods)``; ``retry`` also goes to the pod after that
    one, at once. The stored messages are shown as they come, and each
    session's first summary.

    Raises:
        PodFailedError: A pod failed a turn or exited.
    """
    played: dict[tuple[int, int], list[Played]] = {}
    expected = sum(len(s.turns) for s in stories) + (retry is not None)
    replies = 0

    def send(index: int, turn: int) -> None:
        first = (index + turn) % len(pods)
        targets = [first, (first + 1) % len(pods)] if (index, turn) == retry else [first]
        for target in targets:
            pods[target].orders.send((index, turn))

    for index in range(len(stories)):
        send(index, 0)
    total = sum(len(t.messages) for s in stories for t in s.turns)
    progress.phase("writing", total, "messages")
    watch.quiet = True  # a summary every few calls: the first of each session is noted

    sessions = [s.session for s in stories]
    while True:
        infos = await look(store, sessions, watch, progress)
        progress.update(sum(info.count for info in infos))
        if replies == expected:
            watch.quiet = False
            return played
        waiting = [pod.replies for pod in pods] + [pod.process.sentinel for pod in pods]
        ready = await asyncio.to_thread(multiprocessing.connection.wait, waiting, TICK)
        for pod in pods:
            while pod.replies in ready and pod.replies.poll():
                answer = pod.replies.recv()
                if isinstance(answer, str):
                    raise PodFailedError(answer)
                replies += 1
                key = (answer.session, answer.turn)
                played.setdefault(key, []).append(answer)
                if len(played[key]) == 1 and answer.turn + 1 < len(stories[answer.session].turns):
                    send(answer.session, answer.turn + 1)
            if pod.process.sentinel in ready and replies < expected:
                raise PodFailedError(f"pod {pods.index(pod)} exited with {pod.process.exitcode}")
