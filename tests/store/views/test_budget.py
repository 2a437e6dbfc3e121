"""Budgets: explicit, then the provider's window, then the default; and learned factors.

A model's factor (its tokens per stored cl100k token) starts at the
configured family guess and moves to what the provider reports
(``record_usage``), per tenant, on real Redis.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from support.helpers import turn

from ctxstore import ContextStore, InvalidInputError, RequestView, Settings, resolve_budget
from ctxstore._layout.keys import tenant_ratios_key

FACTORS = {"claude": 1.5}


class Provider:
    """A provider whose get_info() reports a window."""

    def __init__(self, defaults: Any, name: str = "anthropic") -> None:
        self.info = type("Info", (), {"id": name, "defaults": defaults})()

    def get_info(self) -> Any:
        return self.info


def resolve(token_budget: int | None = None, provider: Any = None, model: str | None = None) -> Any:
    return resolve_budget(
        token_budget, provider, model=model, default=50_000, margin=1_000, factors=FACTORS
    )


def test_explicit_budget_wins() -> None:
    """An explicit budget is used even when a provider is given."""
    budget = resolve(8000, Provider({"context_window": 200_000, "max_output_tokens": 8000}))
    assert (budget.tokens, budget.source) == (8000, "explicit")


def test_provider_window_minus_output_and_margin() -> None:
    """The provider's budget is context_window - max_output_tokens - margin."""
    budget = resolve(provider=Provider({"context_window": 200_000, "max_output_tokens": 8000}))
    assert (budget.tokens, budget.source) == (191_000, "provider")
    assert budget.cl100k == 191_000  # no factor is configured for "anthropic" here


def test_model_from_provider_defaults_picks_the_factor() -> None:
    """The model named in the provider's defaults chooses the safety factor."""
    budget = resolve(
        provider=Provider({"context_window": 10_000, "max_output_tokens": 0, "model": "claude-x"})
    )
    assert budget.cl100k == int(9_000 / 1.5)


def test_broken_provider_falls_back_to_default() -> None:
    """A provider whose get_info() fails, or gives no window, leaves the default."""

    class Broken:
        def get_info(self) -> Any:
            raise RuntimeError("no info")

    assert resolve(provider=Broken()).source == "default"
    assert resolve(provider=Provider(None)).tokens == 50_000


@pytest.mark.parametrize("bad", [0, -5, 1.5, "100", True])
def test_bad_explicit_budget_is_refused(bad: Any) -> None:
    """A budget that is not a positive integer is InvalidInputError."""
    with pytest.raises(InvalidInputError):
        resolve(bad)


class Counting(Provider):
    """A provider that counts its get_info() calls."""

    asked = 0

    def get_info(self) -> Any:
        self.asked += 1
        return self.info


def test_provider_is_not_asked_when_budget_and_model_are_given() -> None:
    """An explicit budget and model leave get_info() nothing to add: it is not called."""
    provider = Counting({"context_window": 10_000, "max_output_tokens": 0, "model": "gpt-x"})
    budget = resolve(8000, provider, model="claude-x")
    assert (budget.tokens, budget.model, budget.cl100k) == (8000, "claude-x", int(8000 / 1.5))
    assert provider.asked == 0
    # Without the model, the provider still names it (and so picks the factor).
    assert resolve(8000, provider).model == "gpt-x" and provider.asked == 1
    # Without the budget, it gives the window.
    assert resolve(provider=provider, model="claude-x").source == "provider"
    assert provider.asked == 2


def test_bad_budget_is_refused_before_the_provider_is_asked() -> None:
    """A refused budget does not call the provider first."""
    provider = Counting({"context_window": 10_000, "max_output_tokens": 0})
    with pytest.raises(InvalidInputError):
        resolve(0, provider)
    assert provider.asked == 0


# -- budgets that learn the model's own count -----------------------------------------------


async def sent_view(store: ContextStore, model: str, budget: int = 1_000) -> RequestView:
    """A view of a 50-turn session, for ``model``."""
    if not (await store.info("s")).exists:
        await store.append_many("s", [turn(i) for i in range(50)])
    return await store.view("s", token_budget=budget, model=model)


async def test_record_usage_moves_the_factor_to_the_observed_ratio(store: ContextStore) -> None:
    """Billed 1.1x cl100k: a model's factor goes from the configured 1.4 to 1.15; views grow."""
    first = await sent_view(store, "claude-sonnet-4-5")
    assert first.stats.budget_cl100k == int(1_000 / 1.4)
    for _ in range(5):
        factor = await store.record_usage(
            first, round(first.stats.tokens * 1.1), model="claude-sonnet-4-5"
        )
    assert factor == pytest.approx(1.15)
    after = await sent_view(store, "claude-sonnet-4-5")
    assert after.stats.budget_cl100k == int(1_000 / 1.15) > first.stats.budget_cl100k
    assert after.stats.tokens > first.stats.tokens


async def test_the_factor_moves_by_steps_so_views_keep_their_anchor(store: ContextStore) -> None:
    """Reports a little off the factor in force change nothing: budgets, and anchors, stay."""
    view = await sent_view(store, "gpt-x")
    factors = {
        await store.record_usage(view, round(view.stats.tokens * ratio), model="gpt-x")
        for ratio in (1.0, 1.02, 0.98, 1.01, 0.99, 1.03)
    }
    assert factors == {1.05}  # 1.0 observed + the 0.05 margin, held within a step


async def test_an_overflow_makes_the_next_view_smaller_at_once(store: ContextStore) -> None:
    """The provider refused a view as too long: the next view is smaller, no report needed."""
    before = await sent_view(store, "claude-opus-4")
    factor = await store.record_overflow(model="claude-opus-4")
    assert factor >= 1.4 * 1.15
    after = await sent_view(store, "claude-opus-4")
    assert after.stats.budget_cl100k < before.stats.budget_cl100k
    assert after.stats.tokens < before.stats.tokens


async def test_every_pod_of_the_tenant_learns_it_and_no_other_tenant(
    settings: Settings, tenant: str
) -> None:
    """A factor one pod learned is in force in another pod of the tenant, not in other tenants."""
    async with (
        ContextStore.from_settings(settings, tenant=tenant) as one,
        ContextStore.from_settings(settings, tenant=tenant) as two,
        ContextStore.from_settings(settings, tenant=f"{tenant}-other") as other,
    ):
        view = await sent_view(one, "m-1")
        await one.record_usage(view, view.stats.tokens * 2, model="m-1")
        assert (await sent_view(two, "m-1")).stats.budget_cl100k == int(1_000 / 2.05)
        assert (await sent_view(other, "m-1")).stats.budget_cl100k == 1_000
        assert await one.forget_tenant() == 1
        assert (await sent_view(two, "m-1")).stats.budget_cl100k in (1_000, int(1_000 / 2.05))


async def test_factors_are_bounded(store: ContextStore, raw_redis: Redis) -> None:
    """At most 64 models a tenant, each factor between 1 and 4, whatever the reports."""
    view = await sent_view(store, "m")
    assert await store.record_usage(view, view.stats.tokens * 50, model="m") == 4.0
    assert await store.record_usage(view, 1, model="n") == 1.0
    for i in range(70):
        await store.record_usage(view, view.stats.tokens, model=f"model-{i}")
    key = tenant_ratios_key(store.settings.key_prefix, store.tenant)
    assert await raw_redis.hlen(key) == 64


@pytest.mark.parametrize(
    ("input_tokens", "overhead", "model"),
    [(0, 0, "m"), (-5, 0, "m"), (100, 100, "m"), (100, -1, "m"), (True, 0, "m"), (100, 0, ""),
     (100, 0, "x" * 201), (100, 0, "bad\nmodel"), (100.0, 0, "m")],
)  # fmt: skip
async def test_a_bad_usage_report_is_refused(
    store: ContextStore, input_tokens: Any, overhead: Any, model: Any
) -> None:
    """Counts that are not positive whole numbers, or a bad model name: InvalidInputError."""
    view = await sent_view(store, "m")
    with pytest.raises(InvalidInputError):
        await store.record_usage(view, input_tokens, model=model, overhead_tokens=overhead)
