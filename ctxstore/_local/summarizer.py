"""The local summarizer: a facts ledger and a narrative, offline and deterministic.

The local summarizer (:class:`LocalSummarizer`) folds a conversation's turns into two levels:

- the **ledger**, one line per fact a later turn may need, grouped by kind
  (the task and requests, constraints, decisions, preferences, identifiers,
  numbers, names, dates, paths, tool errors, tool outcomes). Each fact is
  keyed by its subject: a later value for the same subject overwrites it and
  keeps the old one beside it (``batch size: 384 (was 512)``); a restatement
  counts as a reference instead of a new line. Over budget, the facts of the
  lowest kinds that were referred to least go first, never by age; the first
  statement of the task stays.
- the **narrative**, one bullet per stretch of the conversation (what was
  asked, which tools ran and how they ended, what was noted), the oldest
  shrunk first.

Facts are read by regexes and heuristics, no network and no model: from prose
by :mod:`ctxstore._local.facts`, from messages and tool results by
:mod:`ctxstore._local.turns`; they are folded into the entries by
:mod:`ctxstore._local.ledger` and written out by :mod:`ctxstore._local.ledger_text`;
the narrative is :mod:`ctxstore._local.narrative`. The entries travel in
:attr:`Summary.state` between folds, so folding in batches gives the ledger one
pass would. With no state (a text this summarizer or another wrote), the
previous ledger is read back line by line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ctxstore._local.fact_words import BULLET
from ctxstore._local.facts import clip
from ctxstore._local.ledger import Ledger
from ctxstore._local.ledger_text import MORE, fold_foreign_line, parse, render
from ctxstore._local.narrative import NARRATIVE, Story, fit_narrative
from ctxstore.models import Summary
from ctxstore.tokens import TiktokenCounter, TokenCounter

__all__ = ["LocalSummarizer"]


_MORE_SHARE = 0.6
"""Of what level 2 adds to the ledger, the most its further facts take; the narrative
has the rest (and what they leave)."""


class LocalSummarizer:
    """A deterministic, extractive two-level summarizer that needs no network.

    Used where no API key is set. Its ledger keeps, keyed by subject, what an
    agent needs to carry on; a correction overwrites the fact it corrects and
    keeps the old value beside it.

    Args:
        counter: Counts the summary's tokens; cl100k by default.
    """

    name = "local-ledger"

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter or TiktokenCounter()

    async def summarize_levels(
        self,
        previous: Summary | None,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int,
        ledger_tokens: int | None = None,
    ) -> Summary:
        """Fold ``messages`` into ``previous`` and render both levels within budget.

        Args:
            previous: The last summary, or None for the first. Without a state
                (another summarizer's text) its ledger is parsed as well as can be.
            messages: The turns after it, oldest first.
            max_tokens: The budget of the ledger and the narrative joined by a blank line.
            ledger_tokens: The ledger's budget; ``min(600, max_tokens // 3)`` by default.

        Returns:
            The new summary; its ``state`` carries the entries to the next fold.
        """
        # Pure and CPU-bound: a long fold must not stall the worker's lease renewals.
        return await asyncio.to_thread(
            self._fold, previous, messages, max_tokens, ledger_tokens, further=True
        )

    def _fold(
        self,
        previous: Summary | None,
        messages: Sequence[dict[str, Any]],
        max_tokens: int,
        ledger_tokens: int | None,
        *,
        further: bool,
    ) -> Summary:
        """Fold and render; with ``further``, level 2 starts with the facts the ledger left out."""
        ledger, story = _resume(previous)
        for message in messages:
            ledger.fold(message, story)
        default = min(600, max_tokens // 3)
        budget = min(max_tokens, default if ledger_tokens is None else ledger_tokens)
        count = self._counter.count
        entries = list(ledger.entries.values())
        text, shown = render(entries, budget, self._counter, ledger.rank)
        spare = max_tokens - (count(f"{text}\n\n") if text else 0)
        # Level 2: the facts the ledger had no room for, then the narrative.
        shown_ids = {id(e) for e in shown}
        rest = [e for e in entries if id(e) not in shown_ids]
        room = int(spare * _MORE_SHARE) if further else 0
        more, _ = render(rest, room, self._counter, ledger.rank, MORE)
        spare -= count(f"{more}\n\n") if more else 0
        lines = [*story.lines, story.bullet()]
        narrative = fit_narrative(lines, spare, self._counter)
        told = "\n\n".join(part for part in (more, narrative) if part)
        while narrative and count(f"{text}\n\n{told}") > max_tokens:
            spare -= 4  # tokens can merge across the join: fit a little tighter
            narrative = fit_narrative(lines, spare, self._counter)
            told = "\n\n".join(part for part in (more, narrative) if part)
        return Summary(text, told, ledger.dump(story))

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """The one-level protocol: the ledger, a blank line and the narrative, as one text.

        Args:
            previous: An earlier summary's text (this summarizer's is read back
                entry by entry; another's, line by line), or None.
            messages: The turns after it, oldest first.
            max_tokens: The budget of the whole text.

        Returns:
            The new summary's text.
        """
        earlier = Summary(previous, "", None) if previous else None
        # One text has one ledger: no further facts before the narrative.
        summary = await asyncio.to_thread(
            self._fold, earlier, messages, max_tokens, None, further=False
        )
        return "\n\n".join(part for part in (summary.ledger, summary.narrative) if part)


def _resume(previous: Summary | None) -> tuple[Ledger, Story]:
    """The ledger and story to fold into: from the state, else read from the text."""
    story = Story()
    if previous is None:
        return Ledger(), story
    story.lines = parse(f"{NARRATIVE}\n{previous.narrative}")[1]
    ledger = Ledger.load(previous.state, story) if previous.state else None
    if ledger is None:
        ledger, own, foreign = parse(f"{previous.ledger}\n{previous.narrative}")
        unread = [
            ln for ln in foreign if not fold_foreign_line(ledger, ln) and not ln.endswith(":")
        ]
        story.lines = [f"- {clip(BULLET.sub('', ln), 200)}" for ln in unread] + own
    return ledger, story
