"""The narrative: the conversation told stretch by stretch, for :mod:`ctxstore._local.ledger`.

A stretch runs from one user turn to the next; its bullet says what was asked,
which tools ran and how they ended, and what was noted::

    - asked: Pin ctx-client to 3.2.1 | ran: run_tests(tests/) → 42 passed | noted: ctx-client: 3.2.1

Over budget, the oldest bullets shrink first: arguments and wording go, then
all but the noted facts, then the bullet.
"""

from __future__ import annotations

import re
from typing import Any

from ctxstore._local.facts import clip
from ctxstore._local.turns import OUTCOME
from ctxstore.tokens import TokenCounter

NARRATIVE = "Narrative:"
"""The narrative's first line."""


class Story:
    """The conversation's stretches, each from one user turn to the next, as bullets.

    The last stretch stays open across folds: its bullet is redone when the next
    batch continues it, so a batch boundary does not split a stretch.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._asked = ""
        self._ran: dict[str, list[Any]] = {}  # tool -> [calls, failed, first arguments, outcome]
        self._noted: list[list[Any]] = []  # [rank score when noted, line]

    def begin(self, asked: str) -> None:
        """Close the open stretch and start one with what the user asked."""
        self.close()
        self._asked = clip(asked, 110)

    def ran(self, tool: str, arguments: str, ended: str) -> None:
        """Record a call and how it ended."""
        record = self._ran.setdefault(tool, [0, 0, arguments, ""])
        record[0] += 1
        record[1] += ended == "failed"
        if ended != "failed" and OUTCOME.search(ended):
            record[3] = clip(ended, 40)  # worth telling: "42 passed", "installed"

    def note(self, score: int, line: str) -> None:
        """Record a fact this stretch stated or changed, with its rank's score."""
        line = clip(line, 70)
        if all(line != noted for _, noted in self._noted):
            self._noted.append([score, line])

    def bullet(self) -> str:
        """The open stretch as a bullet ("" when it holds nothing)."""
        ran = ", ".join(
            (f"{tool}({args})" if args else tool)
            + (f" x{calls}" if calls > 1 else "")
            + (f" ({failed} failed)" if failed else "")
            + (f" → {ended}" if ended else "")
            for tool, (calls, failed, args, ended) in self._ran.items()
        )
        best = sorted(self._noted, key=lambda scored: -scored[0])[:10]  # stable: ties in order
        parts = [("asked", self._asked), ("ran", ran), ("noted", "; ".join(n for _, n in best))]
        return _compose(parts)

    def close(self) -> None:
        """Turn the open stretch into a bullet."""
        if bullet := self.bullet():
            self.lines.append(bullet)
        self._asked, self._ran, self._noted = "", {}, []

    def open(self) -> dict[str, Any]:
        """The open stretch, for the state."""
        return {"asked": self._asked, "ran": self._ran, "noted": self._noted}

    def reopen(self, stretch: dict[str, Any]) -> None:
        """Continue the stretch :meth:`open` saved; its bullet, the narrative's last, is redone."""
        self._asked, self._ran, self._noted = stretch["asked"], stretch["ran"], stretch["noted"]
        if self.lines and self.lines[-1] == self.bullet():
            self.lines.pop()


def _compose(parts: list[tuple[str, str]]) -> str:
    kept = [f"{name}: {text}" for name, text in parts if text]
    return "- " + " | ".join(kept) if kept else ""


def _shrink(line: str) -> str:
    """A bullet one step shorter: arguments and wording go first, the noted facts last."""
    parts = dict(p.split(": ", 1) for p in line[2:].split(" | ") if ": " in p)
    if not line.startswith("- ") or not parts or set(parts) - {"asked", "ran", "noted"}:
        return clip(line, 80) if len(line) > 80 else ""  # another summarizer's line
    asked, ran, noted = (parts.get(k, "") for k in ("asked", "ran", "noted"))
    shorter = [("asked", clip(asked, 50)), ("ran", re.sub(r"(?<=\w)\([^()]*\)", "", ran))]
    if [text for _, text in shorter] != [asked, ran]:
        return _compose([*shorter, ("noted", noted)])
    return _compose([("noted", noted)]) if asked or ran else ""


def fit_narrative(lines: list[str], budget: int, counter: TokenCounter) -> str:
    """The narrative in ``budget`` tokens, the oldest bullets shrunk (then dropped) first."""
    lines = [line for line in lines if line]
    if not lines or budget <= counter.count(NARRATIVE) + 2:
        return ""
    costs = [counter.count(f"{line}\n") for line in lines]
    total = counter.count(NARRATIVE) + sum(costs)
    for _ in range(3):  # each pass shrinks every line one step, oldest first
        for i, line in enumerate(lines):
            if total <= budget:
                break
            lines[i] = _shrink(line) if line else ""
            cost = counter.count(f"{lines[i]}\n") if lines[i] else 0
            total, costs[i] = total + cost - costs[i], cost
    kept = [line for line in lines if line]
    text = "\n".join([NARRATIVE, *kept])
    while kept and counter.count(text) > budget:
        kept.pop(0)
        text = "\n".join([NARRATIVE, *kept])
    return text if kept else ""
