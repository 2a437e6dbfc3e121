"""Where a request view's token budget comes from.

In order: the caller's explicit budget; else the provider's window, as seed
000 of the Amplifier contract says (``context_window - max_output_tokens -
safety margin`` from ``provider.get_info().defaults``); else the settings'
default. The budget is in the model's tokens; stored counts are cl100k, so
it is divided by the model family's safety factor before it is compared
with them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxstore.errors import InvalidInputError
from ctxstore.tokens import safety_factor

if TYPE_CHECKING:
    from ctxstore.settings import Settings

__all__ = ["Budget", "resolve_budget"]

log = logging.getLogger(__name__)

MAX_BUDGET = 100_000_000
"""The largest budget accepted: far beyond any model's window."""


@dataclass(frozen=True, slots=True)
class Budget:
    """A resolved budget.

    Attributes:
        tokens: The budget in the model's tokens.
        cl100k: The same budget in stored (cl100k) tokens.
        model: The model (or provider) name the factor was chosen for.
        source: ``"explicit"``, ``"provider"`` or ``"default"``.
        factor: Model tokens per stored (cl100k) token, assumed.
    """

    tokens: int
    cl100k: int
    model: str | None
    source: str
    factor: float = 1.0


def resolve_budget(
    token_budget: int | None,
    provider: Any | None,
    *,
    model: str | None,
    settings: Settings | None = None,
    default: int | None = None,
    margin: int | None = None,
    factors: Mapping[str, float] | None = None,
    learned: Mapping[str, float] | None = None,
) -> Budget:
    """Resolve the budget of one request view.

    Args:
        token_budget: An explicit budget, or ``None``.
        provider: An Amplifier provider (anything with ``get_info()``), or ``None``.
        model: The model's name, when the caller knows it.
        settings: Where ``default``, ``margin`` and ``factors`` come from when
            they are not given.
        default: The budget when neither of the above gives one.
        margin: Tokens kept free below a provider's window.
        factors: Model family -> safety factor.
        learned: Model -> the factor observed from the provider's own counts
            (``ContextStore.record_usage``); it wins over the family's.

    Raises:
        InvalidInputError: The explicit budget is not a positive integer.
    """
    if settings is not None:
        default = settings.default_token_budget if default is None else default
        margin = settings.provider_safety_margin if margin is None else margin
        factors = settings.token_safety_factors if factors is None else factors
    if default is None or margin is None or factors is None:
        raise TypeError("resolve_budget needs settings, or default, margin and factors")
    if token_budget is not None and (
        isinstance(token_budget, bool)
        or not isinstance(token_budget, int)
        or not 0 < token_budget <= MAX_BUDGET
    ):
        raise InvalidInputError(
            f"token_budget must be an integer from 1 to {MAX_BUDGET:,}, "
            f"not a {type(token_budget).__name__} out of range"
        )
    # The provider gives a window and a model name: with both given, it has
    # nothing to add, and is not asked.
    info = {} if token_budget is not None and model else _provider_info(provider)
    model = model or info.get("model")
    if token_budget is not None:
        tokens, source = token_budget, "explicit"
    elif info.get("window"):
        tokens, source = info["window"] - margin, "provider"
        if tokens <= 0:
            log.warning("provider window %s leaves no room; using the default budget", info)
            tokens, source = default, "default"
    else:
        tokens, source = default, "default"
    factor = (learned or {}).get(model or "") or safety_factor(factors, model)
    return Budget(tokens, max(1, int(tokens / factor)), model, source, factor)


def _provider_info(provider: Any | None) -> dict[str, Any]:
    """Window and model name from ``provider.get_info()``; empty when it has none."""
    if provider is None:
        return {}
    try:
        info = provider.get_info()
    except Exception:
        log.warning("provider.get_info() failed; using the default budget", exc_info=True)
        return {}
    defaults = getattr(info, "defaults", None)
    if not isinstance(defaults, Mapping):
        defaults = {}
    found: dict[str, Any] = {}
    name = defaults.get("model") or getattr(info, "id", None) or getattr(provider, "name", None)
    if isinstance(name, str):
        found["model"] = name
    window, output = defaults.get("context_window"), defaults.get("max_output_tokens")
    if isinstance(window, int) and isinstance(output, int) and window > 0 and output >= 0:
        found["window"] = window - output
    return found
