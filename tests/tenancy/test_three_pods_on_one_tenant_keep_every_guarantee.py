"""Three pods on one tenant keep every guarantee, whatever hypothesis makes them do.

The state machine (``support.machine.TenantMachine``) drives three pods through every
write path, leases, limits, expiry and lost replies, and after every step checks the raw
keys against what the pods were told.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck
from hypothesis.stateful import run_state_machine_as_test
from support.config import examples
from support.machine import TenantMachine

from ctxstore import Settings


def _run_machine(settings: Settings, redis_url: str, **options: Any) -> int:
    machine = type(
        "Machine",
        (TenantMachine,),
        {"base": settings, "redis_url": redis_url, "steps": 0},
    )
    run_state_machine_as_test(
        machine,
        settings=hypothesis.settings(
            deadline=None, suppress_health_check=list(HealthCheck), **options
        ),
    )
    return machine.steps


def test_three_pods_on_one_tenant_keep_every_guarantee(settings: Settings, redis_url: str) -> None:
    """3 pods, every write path, leases, limits, expiry, lost replies: raw keys agree each step."""
    steps = _run_machine(
        settings,
        redis_url,
        max_examples=examples(25),
        stateful_step_count=30,
        derandomize=True,
    )
    assert steps >= 25 * 10


@pytest.mark.soak
def test_three_pods_on_one_tenant_keep_every_guarantee_soak(
    settings: Settings, redis_url: str
) -> None:
    """The same machine, 400 runs of up to 60 steps (random seeds)."""
    steps = _run_machine(settings, redis_url, max_examples=examples(400), stateful_step_count=60)
    assert steps >= 400 * 20
