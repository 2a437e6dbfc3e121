"""The shape of an anchored view: how far a step cuts back, and which results go as previews.

A view breaks the provider's prompt cache once per step
(:func:`ctxstore._plan.anchored.plan_anchored`) and then grows by what each
model call adds until it is full again. How far a step cuts it back (its
low-water mark) trades the budget it fills against the calls it lasts; both
depend on what each call adds (:func:`per_call`), most of which is tool
results, which go as their previews past a share of the budget
(:func:`sends_preview`) unless the whole history fits in full. Pure
functions of the entries and the budget: while an anchor holds, a
message's form never changes from one view to the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ctxstore._layout.codec import Entry
from ctxstore._layout.formats import CALL_ITEMS, REASONING, item_type

__all__ = ["Shape", "form_cost", "per_call", "sends_preview"]


@dataclass(frozen=True, slots=True)
class Shape:
    """How an anchored view is shaped, as shares of its budget.

    Attributes:
        low_water: Where the raw part is cut back to, at most, when the view
            would overflow: the view then grows by appends alone, its prefix
            unchanged, until it is full again.
        summary_share: The most of the budget a summary may take.
        full_share: A tool result larger than this share of a 4,000-token
            budget is sent as its preview (when it has one) unless the
            whole history fits in full, so one result never crowds out the
            rest; the share grows with the budget's fourth root (twice as
            large at 64,000 tokens).
        calls: How many model calls a step should last at a 4,000-token
            budget (more at larger budgets, as their fourth root): the view
            is cut back further, down to ``low_water_floor``, when each call
            adds so much that ``low_water`` would break the prompt cache sooner.
        low_water_floor: The least a step cuts the raw part back to.
    """

    low_water: float = 0.8
    summary_share: float = 0.4
    full_share: float = 0.25
    calls: float = 10.0
    low_water_floor: float = 0.55

    def low_water_for(self, budget: int, growth: float | None) -> float:
        """The low-water mark of a step, for a session whose calls add ``growth`` tokens each.

        A view cut back to a share ``L`` of its budget lasts about
        ``(1 - L) * budget / growth`` calls before its next step (its next cache
        break): ``L`` is chosen so that is ``calls * (budget / 4000) ** 0.25``,
        within ``[low_water_floor, low_water]``. ``None`` (growth not known):
        ``low_water``.
        """
        if not growth:
            return self.low_water
        wanted = self.calls * math.sqrt(math.sqrt(budget / _CALLS_AT))
        share = 1 - wanted * growth / budget
        return min(self.low_water, max(self.low_water_floor, share))


_CALLS_AT = 4_000
"""The budget at which a step should last ``Shape.calls`` model calls."""


def form_cost(entry: Entry, budget: int, shape: Shape) -> int:
    """The tokens ``entry`` is stored at in the form it is sent in at ``budget``.

    The form (its preview when it is too large) is a function of the entry
    and the budget only, so a message's form never changes from one view to
    the next (a history that fits in full is sent whole instead). A preview
    is sent a few tokens off its stored size (its placeholders are filled
    in): the planner counts it as sent.
    """
    return entry.preview_tokens if sends_preview(entry, budget, shape) else entry.tokens


def sends_preview(entry: Entry, budget: int, shape: Shape) -> bool:
    """True when ``entry`` goes as its preview at ``budget`` (unless the whole history fits)."""
    if entry.preview_data is None:
        return False
    return entry.tokens > shape.full_share * math.sqrt(math.sqrt(budget / _CALLS_AT)) * budget


def per_call(raw: Sequence[Entry], cost: Callable[[Entry], int], budget: int) -> float | None:
    """The tokens each model call added to the view, lately: ``None`` when too few to tell.

    A view is read before each of the agent's turns, so the newest budget's worth
    of entries, divided by the agent's turns among them (runs of its messages),
    is what a call adds.
    """
    tokens = turns = 0
    agent = False
    for entry in reversed(raw):
        if tokens >= budget:
            break
        tokens += cost(entry)
        said = _agent(entry.message)
        turns += said and not agent
        agent = said
    return tokens / turns if turns >= _TURNS else None


_TURNS = 3
"""Agent turns a growth estimate needs."""


def _agent(message: dict[str, Any]) -> bool:
    """Whether a message is the agent's own (its text, calls or reasoning)."""
    kind = item_type(message)
    if kind is not None:
        return kind in CALL_ITEMS or kind == REASONING or message.get("role") == "assistant"
    return message.get("role") == "assistant"
