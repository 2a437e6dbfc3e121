"""Amplifier's message forms in the pure parts: validation, ids, repairs, tokens.

Amplifier's orchestrators write an assistant's calls as ``{"id", "tool",
"arguments"}`` in ``tool_calls`` and again as ``tool_call`` content blocks
(amplifier-core's ``ToolCallBlock`` dumped), thinking as ``{"type":
"thinking", "text"}`` (its content models) or amplifier-core's
``ThinkingBlock``, and a ``tool_result`` block may name its call
``tool_call_id``. These are checked, paired and counted like the other forms.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from ctxstore import InvalidMessageError, count_message
from ctxstore._cli.render import _preview
from ctxstore._layout.formats import call_ids, result_ids
from ctxstore._layout.messages import check_message
from ctxstore._local.turns import turn
from ctxstore._parts.search import message_text
from ctxstore._plan.pairs import without_calls, without_results
from ctxstore.summarizers import render_transcript
from ctxstore.testing import WordCounter
from ctxstore.tokens import PART_OVERHEAD


def amp_call(*ids: str, blocks: bool = True) -> dict[str, Any]:
    """An assistant message calling ``ids`` as loop-basic writes it (blocks: as from Anthropic)."""
    content: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "plan", "signature": "sig", "visibility": "internal"},
        {"type": "text", "text": "Looking.", "visibility": None},
    ]
    if blocks:
        content += [
            {"type": "tool_call", "id": c, "name": "grep", "input": {"q": c}, "visibility": None}
            for c in ids
        ]
    calls = [{"id": c, "tool": "grep", "arguments": {"q": c}} for c in ids]
    return {"role": "assistant", "content": content, "tool_calls": calls}


def check(message: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    checked = check_message(message, max_bytes=1 << 20)
    return checked.call_ids, checked.result_ids


@pytest.mark.parametrize(
    ("message", "ids"),
    [
        (
            {"role": "assistant", "content": "", "tool_calls": [amp_call("a")["tool_calls"][0]]},
            (("a",), ()),
        ),
        (amp_call("a", "b"), (("a", "b"), ())),
        (amp_call("a", "b", blocks=False), (("a", "b"), ())),
        (
            {"role": "assistant", "content": [{"type": "tool_call", "id": "x", "name": "grep"}]},
            (("x",), ()),
        ),
        ({"role": "tool", "name": "grep", "tool_call_id": "a", "content": "hit"}, ((), ("a",))),
        (
            {
                "role": "tool",
                "content": [{"type": "tool_result", "tool_call_id": "a", "output": 1}],
            },
            ((), ("a",)),
        ),
        (
            {
                "role": "tool",
                "tool_call_id": "a",
                "content": [{"type": "tool_result", "tool_call_id": "a", "output": {"ok": True}}],
            },
            ((), ("a",)),
        ),
        (
            {"role": "assistant", "content": [{"type": "thinking", "text": "why"}]},
            ((), ()),
        ),
        (
            {"role": "user", "content": "hi", "name": None, "tool_call_id": None, "metadata": None},
            ((), ()),
        ),
    ],
)
def test_amplifier_forms_are_accepted_with_their_ids(
    message: dict[str, Any], ids: tuple[tuple[str, ...], tuple[str, ...]]
) -> None:
    """Each form Amplifier writes passes, its calls counted once however often it is written."""
    assert check(message) == ids
    assert (tuple(call_ids(message)), tuple(result_ids(message))) == ids


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
            "a tool call needs a function (OpenAI",
        ),
        (
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "tool": "grep"}]},
            "needs its arguments (a dict)",
        ),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "a", "tool": "grep", "arguments": '{"q": 1}'}],
            },
            "needs its arguments (a dict)",
        ),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "a", "tool": "", "arguments": {}}],
            },
            "tool is its name",
        ),
        (
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "", "tool": "g", "arguments": {}}],
            },
            "tool_calls.0.id",
        ),
        ({"role": "assistant", "content": [{"type": "thinking"}]}, "a thinking block needs"),
        (
            {"role": "user", "content": [{"type": "tool_call", "id": "a", "name": "g"}]},
            "tool_call blocks are only allowed in assistant messages",
        ),
        (
            {"role": "tool", "content": [{"type": "tool_result", "output": "x"}]},
            "needs the id of the call it answers",
        ),
        (
            {
                "role": "tool",
                "content": [{"type": "tool_result", "tool_use_id": "a", "tool_call_id": "b"}],
            },
            "answers one call",
        ),
        (
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_call", "id": "a", "name": "g"},
                    {"type": "tool_use", "id": "a", "name": "g", "input": {}},
                ],
            },
            "same tool call id twice",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "tool_call", "id": "a", "name": "g"}] * 2,
            },
            "same tool call id twice",
        ),
    ],
)
def test_a_malformed_amplifier_form_is_refused_saying_why(
    message: dict[str, Any], says: str
) -> None:
    """A call without its tool or dict arguments, a block in the wrong place: a clear refusal."""
    with pytest.raises(InvalidMessageError, match=re.escape(says)):
        check(message)


def test_a_dropped_call_leaves_neither_its_entry_nor_its_block() -> None:
    """Stripping an unanswered call removes it from tool_calls and its tool_call block too."""
    message = amp_call("a", "b")
    kept = without_calls(message, {"a"})
    assert kept is not None
    assert [c["id"] for c in kept["tool_calls"]] == ["a"]
    assert [b.get("id") for b in kept["content"] if b["type"] == "tool_call"] == ["a"]
    assert call_ids(kept) == ["a"]
    assert [b["type"] for b in kept["content"]][:2] == ["thinking", "text"]


def test_a_message_of_only_dropped_calls_is_not_sent() -> None:
    """loop-basic's call with empty content, its only call unanswered: nothing left to send."""
    message = {"role": "assistant", "content": "", "tool_calls": [amp_call("a")["tool_calls"][0]]}
    assert without_calls(message, set()) is None


def test_an_amplifier_result_block_is_stripped_by_its_call_id() -> None:
    """A tool_result block naming tool_call_id keeps or loses its result like Anthropic's."""
    message = {
        "role": "tool",
        "content": [
            {"type": "tool_result", "tool_call_id": "a", "output": "one"},
            {"type": "tool_result", "tool_call_id": "b", "output": "two"},
        ],
    }
    kept = without_results(message, {"b"})
    assert kept == {"role": "tool", "content": [message["content"][1]]}


def test_a_tool_message_and_its_block_answering_one_call_are_kept_whole() -> None:
    """amplifier-core's tool Message with a ToolResultBlock of its own call is one answer."""
    message = {
        "role": "tool",
        "tool_call_id": "a",
        "content": [{"type": "tool_result", "tool_call_id": "a", "output": "one"}],
    }
    assert without_results(message, {"a"}) == message
    assert without_results(message, set()) is None


def test_a_call_written_twice_is_counted_once() -> None:
    """A tool_call block repeating a tool_calls entry costs nothing more: it is sent once."""
    counter = WordCounter()
    assert count_message(counter, amp_call("a", "b")) == count_message(
        counter, amp_call("a", "b", blocks=False)
    )


def test_amplifier_arguments_and_thinking_block_are_counted() -> None:
    """A dict of arguments is counted as the JSON sent; loop-streaming's thinking_block too."""
    counter = WordCounter()
    bare = {"role": "assistant", "content": "x", "tool_calls": []}
    call = {"id": "c", "tool": "grep", "arguments": {"pattern": "a b"}}
    # words: the id, the tool, and the JSON {"pattern": "a b"} (3 words)
    called = count_message(counter, {**bare, "tool_calls": [call]})
    assert called == count_message(counter, bare) + PART_OVERHEAD + 1 + 1 + 3
    thinking = {"type": "thinking", "thinking": "four words of thought", "signature": "s s s"}
    with_thinking = count_message(counter, {**bare, "thinking_block": thinking})
    assert with_thinking == count_message(counter, bare) + 4


def test_the_summary_transcript_names_each_amplifier_call_once() -> None:
    """A call in tool_calls and its tool_call block read as one call; results by either id."""
    transcript = render_transcript(
        [
            amp_call("a"),
            {"role": "tool", "tool_call_id": "a", "content": "hit"},
            {
                "role": "tool",
                "content": [{"type": "tool_result", "tool_call_id": "b", "output": 7}],
            },
        ]
    )
    assert transcript.count("[calls grep") == 1
    assert '[calls grep({"q": "a"}) as a]' in transcript
    assert "[tool result for a] hit" in transcript
    assert "[result of b] 7" in transcript


def test_the_ledger_reads_an_amplifier_call_once_with_its_tool() -> None:
    """The local summarizer's reading of a message: the call's id, tool and arguments, once."""
    read = turn(amp_call("a"))
    assert read is not None
    assert [(cid, tool) for cid, tool, _ in read.calls] == [("a", "grep")]
    result = turn({"role": "tool", "content": [{"type": "tool_result", "tool_call_id": "b"}]})
    assert result is not None and [r[0] for r in result.results] == ["b"]


def test_search_indexes_an_amplifier_call_as_an_openai_one() -> None:
    """The tool's name and its arguments' names and values are searchable, as parsed JSON is."""
    amplifier = {"role": "assistant", "content": "", "tool_calls": [amp_call("a")["tool_calls"][0]]}
    openai = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "a", "function": {"name": "grep", "arguments": '{"q": "a"}'}}],
    }
    assert message_text(amplifier).split() == message_text(openai).split()


def test_the_cli_shows_an_amplifier_call_by_its_tool() -> None:
    """`ctxstore view --messages` names the tools of a call with empty content, in either form."""
    amplifier = {"role": "assistant", "content": "", "tool_calls": amp_call("a")["tool_calls"]}
    openai = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "ls"}}]}
    assert (_preview(amplifier), _preview(openai)) == ("calls grep", "calls ls")
