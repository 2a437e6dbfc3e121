"""Bodies of the processes the multi-process tests start (importable by spawn)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ctxstore import ConflictError, ContextStore, Settings


def settings_for(url: str, prefix: str) -> Settings:
    """Settings for a child process on the test Redis and prefix."""
    return Settings(
        redis_url=url,
        key_prefix=prefix,
        queue_name=f"{prefix}:summaries",
        retry_attempts=8,
        retry_base_delay=0.01,
    )


def writer(
    url: str, prefix: str, tenant: str, writer_id: int, sessions: list[str], count: int, out: Any
) -> None:
    """Append ``count`` messages round-robin over ``sessions``; report acks to ``out``."""

    async def run() -> list[tuple[str, str, int, int]]:
        acks = []
        async with ContextStore.from_settings(settings_for(url, prefix), tenant=tenant) as store:
            for i in range(count):
                session = sessions[i % len(sessions)]
                body = {"role": "user", "content": json.dumps({"w": writer_id, "i": i})}
                result = await store.append(session, body)
                acks.append((session, result.entry_id, result.epoch, i))
        return acks

    out.put((writer_id, asyncio.run(run())))


def racer(
    url: str, prefix: str, tenant: str, racer_id: int, rounds: int, barrier: Any, out: Any
) -> None:
    """Each round: wait at the barrier, read seq, replace-if; report win or conflict."""

    async def run() -> list[str]:
        outcomes = []
        async with ContextStore.from_settings(settings_for(url, prefix), tenant=tenant) as store:
            for round_no in range(rounds):
                await asyncio.to_thread(barrier.wait)
                seq = (await store.info("race")).seq
                await asyncio.to_thread(barrier.wait)  # both have read the same seq
                message = {"role": "user", "content": f"round {round_no} by {racer_id}"}
                try:
                    await store.replace("race", [message], expected_seq=seq)
                    outcomes.append("win")
                except ConflictError:
                    outcomes.append("conflict")
        return outcomes

    out.put((racer_id, asyncio.run(run())))


def rewriter(url: str, prefix: str, tenant: str, rounds: int, out: Any) -> None:
    """Replace or clear the session ``rounds`` times, reporting each result."""

    async def run() -> list[tuple[int, int, int]]:
        results = []
        async with ContextStore.from_settings(settings_for(url, prefix), tenant=tenant) as store:
            for n in range(rounds):
                if n % 2:
                    result = await store.clear("busy")
                else:
                    result = await store.replace(
                        "busy", [{"role": "system", "content": f"reset {n}"}]
                    )
                results.append((result.epoch, result.superseded, result.count))
        return results

    out.put(("rewriter", asyncio.run(run())))


def endless_writer(url: str, prefix: str, tenant: str, session: str) -> None:
    """Append batches forever (until killed)."""

    async def run() -> None:
        async with ContextStore.from_settings(settings_for(url, prefix), tenant=tenant) as store:
            n = 0
            while True:
                batch = [{"role": "user", "content": f"m{n}-{k} " * 30} for k in range(5)]
                await store.append_many(session, batch)
                n += 1

    asyncio.run(run())


def stuck_worker(
    url: str, prefix: str, overrides: dict[str, Any], job_timeout: float, signal_key: str
) -> None:
    """Run a burst worker whose summarizer never returns; set ``signal_key`` when it is called.

    The test SIGKILLs this process mid-job, as a node dies under a pod.
    """
    from collections.abc import Sequence

    from redis.asyncio import Redis

    from ctxstore.testing import FakeSummarizer
    from workers import build_worker

    class Signalling(FakeSummarizer):
        async def summarize(
            self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
        ) -> str:
            client = Redis.from_url(url)
            try:
                await client.set(signal_key, "started")
            finally:
                await client.aclose()
            return await super().summarize(previous, messages, max_tokens=max_tokens)

    async def run() -> None:
        settings = settings_for(url, prefix).model_copy(update=overrides)
        never = asyncio.Event()  # the gate never opens: the job hangs until the kill
        worker = build_worker(
            settings, summarizer=Signalling(gate=never), burst=True, job_timeout=job_timeout
        )
        await worker.main()

    asyncio.run(run())
