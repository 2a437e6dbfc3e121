"""Budget resolution: explicit, then provider window, then the default."""

from __future__ import annotations

from typing import Any

import pytest

from ctxstore import InvalidInputError, resolve_budget

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
