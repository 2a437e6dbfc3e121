"""The two installs: a pod's (the SDK, newest redis-py, the frameworks) and a worker's.

``make test`` runs the whole suite in the worker's virtualenv, and the Redis edge
and the adapters in two pod virtualenvs (with and without hiredis). These tests
check what only the pair shows: the pod's environment resolves beside the OpenAI Agents SDK
and LangChain, imports neither arq nor anthropic, and a job a pod on the
newest redis-py queued is run by a real arq worker from the worker's
environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import redis
from support.config import REPO
from support.helpers import append_until_due

from ctxstore import ContextStore, Settings

WORKER_CTXSTORE = REPO / ".venv" / "bin" / "ctxstore"
"""The ``ctxstore`` command of the worker environment (``make test`` builds it first)."""


def _in_pod_environment() -> bool:
    try:
        import agents  # noqa: F401
        import langchain_core  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _in_pod_environment(), reason="a pod's environment: openai-agents and langchain-core"
)


def test_the_pod_environment_resolves_beside_the_frameworks() -> None:
    """`pip check` finds no broken requirement; redis-py is the 7+ openai-agents[redis] needs."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(redis.__version__.split(".")[0]) >= 7


def test_importing_ctxstore_and_its_integrations_loads_no_worker_package() -> None:
    """A pod imports the SDK and both adapters without arq or anthropic (not installed here)."""
    probe = (
        "import sys, json, ctxstore, ctxstore.integrations.openai_agents, "
        "ctxstore.integrations.langchain; "
        "print(json.dumps(sorted(m for m in ('arq', 'anthropic') if m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout) == []


async def test_a_job_a_pod_queued_on_the_newest_redis_py_runs_on_a_real_arq_worker(
    summary_settings: Settings, tenant: str
) -> None:
    """This process (redis-py 7+, no arq) queues; the worker venv's ``ctxstore worker`` commits."""
    if not WORKER_CTXSTORE.exists():
        pytest.fail(f"{WORKER_CTXSTORE} is missing: run `make install` (make test does)")
    settings = summary_settings.model_copy(update={"worker_name": f"cross-{tenant}"})
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        await append_until_due(store, "s")
        info = await store.info("s")
        assert info.summary_due and info.summary_runs == 0
        assert settings.redis_url is not None
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CTXSTORE_", "VIRTUAL_ENV")) and k != "ANTHROPIC_API_KEY"
        } | {
            "CTXSTORE_REDIS_URL": settings.redis_url,
            "CTXSTORE_KEY_PREFIX": settings.key_prefix,
            "CTXSTORE_QUEUE_NAME": settings.queue_name,
            "CTXSTORE_SUMMARY_TRIGGER_TOKENS": str(settings.summary_trigger_tokens),
            "CTXSTORE_SUMMARY_KEEP_TOKENS": str(settings.summary_keep_tokens),
            "CTXSTORE_WORKER_NAME": settings.worker_name,
        }
        proc = await asyncio.create_subprocess_exec(
            str(WORKER_CTXSTORE),
            "worker",
            "--burst",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, out.decode()
        info = await store.info("s")
        assert info.summary_runs == 1, out.decode()
        assert info.summary_last_outcome == "committed" and not info.summary_due
        assert info.summary_covers is not None
