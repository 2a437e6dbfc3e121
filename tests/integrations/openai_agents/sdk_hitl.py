"""The SDK's test helper for shell calls, as it is.

Origin: openai/openai-agents-python, tests/utils/hitl.py (``make_shell_call``), at
commit 7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (main, version 0.22.0).
"""

from __future__ import annotations

from typing import cast

from agents.items import TResponseOutputItem


def make_shell_call(
    call_id: str,
    *,
    id_value: str | None = None,
    commands: list[str] | None = None,
    status: str = "in_progress",
) -> TResponseOutputItem:
    """Build a shell_call payload with optional overrides."""
    return cast(
        TResponseOutputItem,
        {
            "type": "shell_call",
            "id": id_value or call_id,
            "call_id": call_id,
            "status": status,
            "action": {"type": "exec", "commands": commands or ["echo test"], "timeout_ms": 1000},
        },
    )
