"""The Amplifier adapter: amplifier-core's own contract tests, events, resume."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from amplifier_core.testing import MockCoordinator
from amplifier_core.validation.behavioral import ContextBehaviorTests
from support.config import RUN_PREFIX
from support.helpers import conversation, paired

import ctxstore.integrations.amplifier
from ctxstore import (
    BudgetExceededError,
    ConfigurationError,
    ContextStore,
    InvalidInputError,
    Settings,
)
from ctxstore.integrations.amplifier import StoreContextManager, mount

ADAPTER = Path(ctxstore.integrations.amplifier.__file__)


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    """mount() reads settings from the environment: point it at the test Redis."""
    monkeypatch.setenv("CTXSTORE_REDIS_URL", redis_url)
    monkeypatch.setenv("CTXSTORE_KEY_PREFIX", RUN_PREFIX)
    monkeypatch.setenv("CTXSTORE_QUEUE_NAME", f"{RUN_PREFIX}:summaries")


class TestContextBehavior(ContextBehaviorTests):
    """amplifier-core's behavioral contract tests, run against the adapter."""

    @pytest.fixture
    def module_path(self) -> Path:
        """The adapter module, for the plugin's context_module fixture."""
        return ADAPTER


class Recorder:
    """Hooks that record what is emitted."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        self.events.append((event, data))


@pytest.fixture
def manager(store: ContextStore) -> tuple[StoreContextManager, Recorder]:
    """An adapter over a fresh session, with recorded hooks."""
    hooks = Recorder()
    return StoreContextManager(store, "conv", max_tokens=400, hooks=hooks), hooks


async def test_compaction_emits_pre_and_post_events(
    manager: tuple[StoreContextManager, Recorder],
) -> None:
    """A view that drops messages emits pre_compact and post_compact with counts."""
    context, hooks = manager
    for message in conversation(25):
        await context.add_message(message)
    messages = await context.get_messages_for_request()
    names = [name for name, _ in hooks.events]
    assert names == ["context:pre_compact", "context:post_compact"]
    pre, post = hooks.events[0][1], hooks.events[1][1]
    assert pre["message_count"] == len(await context.get_messages())
    assert post["message_count"] == len(messages) < pre["message_count"]
    assert post["token_count"] <= 400 * context.compaction_threshold < pre["token_count"]


async def test_no_events_when_everything_fits(
    manager: tuple[StoreContextManager, Recorder],
) -> None:
    """A history within the threshold is returned whole, with no compaction events."""
    context, hooks = manager
    await context.add_message({"role": "user", "content": "hi"})
    assert await context.get_messages_for_request() == [{"role": "user", "content": "hi"}]
    assert hooks.events == []


async def test_compaction_preserves_tool_pairs(
    manager: tuple[StoreContextManager, Recorder],
) -> None:
    """Seed 000's tool-pair test: no orphan results, no unanswered calls."""
    context, _ = manager
    await context.add_message({"role": "user", "content": "Read file.txt"})
    await context.add_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_123",
                    "type": "function",
                    "function": {"name": "read", "arguments": "{}"},
                }
            ],
        }
    )
    await context.add_message(
        {"role": "tool", "tool_call_id": "call_123", "content": "File contents..."}
    )
    for i in range(50):
        await context.add_message({"role": "user", "content": f"Message {i}"})
    kept = [
        paired(await context.get_messages_for_request(token_budget=budget))
        for budget in (30, 60, 200, 1000)
    ]
    assert kept == [0, 0, 0, 1]  # the pair is sent once the budget holds it, whole


async def test_set_messages_and_clear(manager: tuple[StoreContextManager, Recorder]) -> None:
    """set_messages replaces the history (resume) and clear empties it."""
    context, _ = manager
    saved = [
        {"role": "user", "content": "Previous conversation"},
        {"role": "assistant", "content": "ok"},
    ]
    await context.add_message({"role": "user", "content": "will be replaced"})
    await context.set_messages(saved)
    assert await context.get_messages() == saved
    await context.clear()
    assert await context.get_messages() == []


async def test_over_budget_floor_raises(manager: tuple[StoreContextManager, Recorder]) -> None:
    """When system messages alone exceed the budget, the adapter raises, never loops."""
    context, _ = manager
    await context.add_message({"role": "system", "content": "rule " * 600})
    with pytest.raises(BudgetExceededError) as caught:
        await context.get_messages_for_request()
    assert caught.value.required > caught.value.budget


class CountingProvider:
    """A provider that counts how often it is asked for its info."""

    def __init__(self) -> None:
        self.asked = 0

    def get_info(self) -> Any:
        self.asked += 1
        return type("Info", (), {"id": "p", "defaults": {"model": "gpt-x"}})()


@pytest.fixture
def counted_views(
    monkeypatch: pytest.MonkeyPatch, manager: tuple[StoreContextManager, Recorder]
) -> list[int]:
    """The budgets (cl100k) of the store views the manager reads, in order."""
    context, _ = manager
    budgets: list[int] = []
    view = context.store.view

    async def counting(*args: Any, **kwargs: Any) -> Any:
        result = await view(*args, **kwargs)
        budgets.append(result.stats.budget_cl100k)
        return result

    monkeypatch.setattr(context.store, "view", counting)
    return budgets


async def test_protected_over_the_full_budget_raises_after_one_read(
    manager: tuple[StoreContextManager, Recorder], counted_views: list[int]
) -> None:
    """No retry at the full budget when the protected messages cannot fit it either."""
    context, _ = manager
    await context.add_message({"role": "system", "content": "rule " * 600})
    provider = CountingProvider()
    with pytest.raises(BudgetExceededError) as caught:
        await context.get_messages_for_request(token_budget=400, provider=provider)
    assert (caught.value.budget, provider.asked) == (400, 1)
    assert counted_views == [int(400 * context.compaction_threshold)]


async def test_protected_over_the_threshold_retries_at_the_full_budget(
    manager: tuple[StoreContextManager, Recorder], counted_views: list[int]
) -> None:
    """Protected messages past the threshold but within the budget: one retry, one get_info."""
    context, _ = manager
    system = {"role": "system", "content": "rule " * 375}
    await context.add_message(system)
    await context.add_message({"role": "user", "content": "hi"})
    provider = CountingProvider()
    messages = await context.get_messages_for_request(token_budget=400, provider=provider)
    assert messages[0] == system
    assert provider.asked == 1
    assert counted_views == [int(400 * context.compaction_threshold), 400]


@pytest.mark.parametrize(
    "config",
    [
        {"compaction_threshold": "0.9"},
        {"compaction_threshold": True},
        {"compaction_threshold": 0},
        {"compaction_threshold": float("nan")},
        {"max_tokens": True},
        {"max_tokens": 1.5},
        {"max_tokens": "4000"},
        {"max_tokens": 0},
        {"keep_stored_on_resume": "no"},
    ],
)
async def test_bad_adapter_config_is_a_configuration_error(config: dict[str, Any]) -> None:
    """Wrong types (booleans are not numbers) and ranges are ConfigurationError, not TypeError."""
    with pytest.raises(ConfigurationError, match="invalid context-ctxstore config"):
        await mount(MockCoordinator(), config)


@pytest.mark.parametrize(
    "kwargs", [{"compaction_threshold": "0.9"}, {"max_tokens": True}, {"max_tokens": 2.0}]
)
def test_bad_manager_arguments_are_invalid_input(store: ContextStore, kwargs: Any) -> None:
    """The manager itself refuses the same values with InvalidInputError."""
    with pytest.raises(InvalidInputError):
        StoreContextManager(store, "conv", **kwargs)


class FailingCoordinator(MockCoordinator):
    """A coordinator whose mount() fails."""

    async def mount(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("mount point taken")


@pytest.mark.parametrize(
    ("coordinator", "config", "error"),
    [
        (FailingCoordinator, {}, RuntimeError),
        (MockCoordinator, {"session_id": 42}, InvalidInputError),  # ids are strings
    ],
)
async def test_a_failed_mount_closes_its_store(
    monkeypatch: pytest.MonkeyPatch,
    coordinator: type[MockCoordinator],
    config: dict[str, Any],
    error: type[Exception],
) -> None:
    """When info(), the manager or coordinator.mount fails, the store is closed, not leaked."""
    closed: list[ContextStore] = []
    aclose = ContextStore.aclose

    async def recording(self: ContextStore) -> None:
        closed.append(self)
        await aclose(self)

    monkeypatch.setattr(ContextStore, "aclose", recording)
    with pytest.raises(error):
        await mount(coordinator(), config)
    assert len(closed) == 1


async def test_mount_with_empty_config_works() -> None:
    """mount() with {} mounts a working manager on a new session and returns a cleanup."""
    coordinator = MockCoordinator()
    cleanup = await mount(coordinator, {})
    context = coordinator.mount_points["context"]
    try:
        await context.add_message({"role": "user", "content": "hi"})
        assert await context.get_messages_for_request() == [{"role": "user", "content": "hi"}]
        other = MockCoordinator()
        other_cleanup = await mount(other, {})
        assert other.mount_points["context"].session_id != context.session_id
        await other_cleanup()
    finally:
        await cleanup()


async def test_pods_share_a_session_by_id(tenant: str) -> None:
    """Two mounts with the same session_id see one history (two pods, one conversation)."""
    config = {"tenant": tenant, "session_id": "shared-conv"}
    pod_a, pod_b = MockCoordinator(), MockCoordinator()
    cleanup_a = await mount(pod_a, config)
    cleanup_b = await mount(pod_b, config)
    try:
        await pod_a.mount_points["context"].add_message({"role": "user", "content": "from a"})
        await pod_b.mount_points["context"].add_message({"role": "assistant", "content": "from b"})
        assert [m["content"] for m in await pod_a.mount_points["context"].get_messages()] == [
            "from a",
            "from b",
        ]
    finally:
        await cleanup_a()
        await cleanup_b()


async def test_any_session_id_is_a_session_of_its_own(store: ContextStore) -> None:
    """Ids the store would refuse (slashes, spaces, non-ASCII) hold their own messages."""
    ids = ["team/alice", "会話 7", "a:b", "_.eteam"]
    for n, session_id in enumerate(ids):
        await StoreContextManager(store, session_id).add_message(
            {"role": "user", "content": str(n)}
        )
    for n, session_id in enumerate(ids):
        messages = await StoreContextManager(store, session_id).get_messages()
        assert messages == [{"role": "user", "content": str(n)}], session_id


async def test_resume_keeps_the_stored_history(tenant: str) -> None:
    """Mounting an existing session ignores the host's first (filtered) set_messages."""
    config = {"tenant": tenant, "session_id": "resumed"}
    first = MockCoordinator()
    cleanup = await mount(first, config)
    full = [{"role": "system", "content": "rules"}, {"role": "user", "content": "q"}]
    for message in full:
        await first.mount_points["context"].add_message(message)
    await cleanup()
    again = MockCoordinator()
    cleanup = await mount(again, config)
    try:
        context = again.mount_points["context"]
        await context.set_messages([{"role": "user", "content": "q"}])  # no system message
        assert await context.get_messages() == full
        await context.set_messages([{"role": "user", "content": "second call applies"}])
        assert await context.get_messages() == [{"role": "user", "content": "second call applies"}]
    finally:
        await cleanup()


async def test_bad_config_is_a_configuration_error() -> None:
    """A config naming an invalid tenant is refused with ConfigurationError."""
    with pytest.raises(ConfigurationError):
        await mount(MockCoordinator(), {"tenant": "bad}tenant"})


def test_entry_point_is_registered() -> None:
    """The package registers mount() as amplifier.modules:context-ctxstore."""
    from importlib.metadata import entry_points

    found = entry_points(group="amplifier.modules", name="context-ctxstore")
    assert [ep.load() for ep in found] == [mount]


def test_amplifier_core_validate_passes(redis_url: str) -> None:
    """`amplifier-core validate context` passes against the adapter.

    amplifier-core's engine leaves tokio threads running at exit, and now and
    then one of them touches the GIL while the interpreter finalizes: the
    process aborts *after* printing its verdict (the crash class of
    PyO3/pyo3-async-runtimes#40; about one run in a hundred here), or dies of
    a segmentation fault there with nothing on stderr (one run in fifteen one
    evening, 2026-11-27), or aborts with its message cut short at "Fatal Python
    error: " (once in a full run, 2026-11-29). Such a run is repeated, at most
    twice; the verdict itself is never retried away.
    """
    cli = Path(sys.executable).with_name("amplifier-core")
    for _ in range(3):
        done = subprocess.run(
            [str(cli), "validate", "context", str(ADAPTER)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = done.stdout + done.stderr
        assert "PASSED" in done.stdout, output
        aborted = done.returncode == -signal.SIGABRT and (
            "finalizing" in done.stderr or done.stderr.strip() == "Fatal Python error:"
        )
        torn_down = aborted or (done.returncode == -signal.SIGSEGV and not done.stderr)
        if not torn_down:
            break
    assert done.returncode == 0, output


def test_settings_keys_exist() -> None:
    """Every config key the adapter maps to settings is a Settings field."""
    assert set(ctxstore.integrations.amplifier._SETTINGS_KEYS) <= set(Settings.model_fields)


async def test_mount_hands_the_recall_tools_to_the_agent(tenant: str) -> None:
    """The tools are mounted beside the context (unless recall_tools is false) and run."""
    coordinator = MockCoordinator()
    cleanup = await mount(coordinator, {"tenant": tenant, "session_id": "recall"})
    try:
        context = coordinator.mount_points["context"]
        tools = coordinator.mount_points["tools"]
        assert {"search_history", "read_entry", "pin_message", "unpin_message"} <= set(tools)
        await context.add_message({"role": "user", "content": "The gate code is 4417."})
        result = await tools["search_history"].execute({"query": "gate code"})
        assert result.success and "4417" in result.output
        entry_id = result.output.split("- entry ")[1].split(" ")[0]
        read = await tools["read_entry"].execute({"entry_id": entry_id})
        assert read.success and read.output.endswith("The gate code is 4417.")
        refused = await tools["read_entry"].execute({"entry_id": 12})
        assert not refused.success and refused.error == {"message": refused.output}
        assert tools["read_entry"].input_schema["required"] == ["entry_id"]
    finally:
        await cleanup()
    bare = MockCoordinator()
    cleanup = await mount(bare, {"tenant": tenant, "recall_tools": False})
    await cleanup()
    assert "search_history" not in bare.mount_points["tools"]
    with pytest.raises(ConfigurationError):
        await mount(MockCoordinator(), {"tenant": tenant, "recall_tools": "yes"})
