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
