"""ctxstore: a distributed, multi-tenant context store for LLM agents, on Redis.

Agent pods append each session's messages to a Redis Stream (lock-free,
idempotent), and before every model call read a budgeted, tool-safe view in
one round trip. See the README for the tour.

The names below are imported on first use (PEP 562): ``import ctxstore`` costs
little, and ``ctxstore --help`` answers at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxstore.budget import (
        Budget,
        resolve_budget,
    )
    from ctxstore.embedded import EmbeddedRedis
    from ctxstore.encryption import Keyring
    from ctxstore.errors import (
        BudgetExceededError,
        ConfigurationError,
        ConflictError,
        CorruptEntryError,
        CtxstoreError,
        DecryptionError,
        EntryNotFoundError,
        EpochChangedError,
        ForgetIncompleteError,
        InvalidIdError,
        InvalidInputError,
        InvalidMessageError,
        LeaseError,
        LeaseHeldError,
        LeaseLostError,
        MalformedArchiveError,
        MessageTooLargeError,
        PermissionDeniedError,
        QuotaExceededError,
        ReplicationError,
        SessionExistsError,
        SessionNotFoundError,
        StoreClosedError,
        StoreError,
        StoreFullError,
        StoreUnavailableError,
        SummarizerError,
        SummarizerUnavailableError,
    )
    from ctxstore.integrations.amplifier import StoreContextManager
    from ctxstore.lease import (
        Clock,
        Lease,
    )
    from ctxstore.models import (
        AppendResult,
        Branch,
        Checkpoint,
        ForkResult,
        HistoryPage,
        ImportResult,
        Message,
        RequestView,
        RewindResult,
        SearchHit,
        SessionInfo,
        SessionSummary,
        StoredMessage,
        SummaryOutcome,
        SummaryStatus,
        TenantLimits,
        ViewStats,
        WriteResult,
    )
    from ctxstore.recall import RecallTools
    from ctxstore.settings import Settings
    from ctxstore.store import ContextStore
    from ctxstore.summarizers import (
        AnthropicSummarizer,
        LocalSummarizer,
        OpenAISummarizer,
        Summarizer,
    )
    from ctxstore.tokens import (
        TiktokenCounter,
        TokenCounter,
        count_message,
    )

_EXPORTS = {
    "AnthropicSummarizer": "ctxstore.summarizers",
    "AppendResult": "ctxstore.models",
    "Branch": "ctxstore.models",
    "Budget": "ctxstore.budget",
    "BudgetExceededError": "ctxstore.errors",
    "Checkpoint": "ctxstore.models",
    "Clock": "ctxstore.lease",
    "ConfigurationError": "ctxstore.errors",
    "ConflictError": "ctxstore.errors",
    "ContextStore": "ctxstore.store",
    "CorruptEntryError": "ctxstore.errors",
    "CtxstoreError": "ctxstore.errors",
    "DecryptionError": "ctxstore.errors",
    "EmbeddedRedis": "ctxstore.embedded",
    "EntryNotFoundError": "ctxstore.errors",
    "EpochChangedError": "ctxstore.errors",
    "ForgetIncompleteError": "ctxstore.errors",
    "ForkResult": "ctxstore.models",
    "HistoryPage": "ctxstore.models",
    "ImportResult": "ctxstore.models",
    "InvalidIdError": "ctxstore.errors",
    "InvalidInputError": "ctxstore.errors",
    "InvalidMessageError": "ctxstore.errors",
    "Keyring": "ctxstore.encryption",
    "Lease": "ctxstore.lease",
    "LeaseError": "ctxstore.errors",
    "LeaseHeldError": "ctxstore.errors",
    "LeaseLostError": "ctxstore.errors",
    "LocalSummarizer": "ctxstore.summarizers",
    "MalformedArchiveError": "ctxstore.errors",
    "Message": "ctxstore.models",
    "MessageTooLargeError": "ctxstore.errors",
    "OpenAISummarizer": "ctxstore.summarizers",
    "PermissionDeniedError": "ctxstore.errors",
    "QuotaExceededError": "ctxstore.errors",
    "ReplicationError": "ctxstore.errors",
    "RecallTools": "ctxstore.recall",
    "RequestView": "ctxstore.models",
    "RewindResult": "ctxstore.models",
    "SearchHit": "ctxstore.models",
    "SessionExistsError": "ctxstore.errors",
    "SessionInfo": "ctxstore.models",
    "SessionNotFoundError": "ctxstore.errors",
    "SessionSummary": "ctxstore.models",
    "Settings": "ctxstore.settings",
    "StoreContextManager": "ctxstore.integrations.amplifier",
    "StoreError": "ctxstore.errors",
    "StoreFullError": "ctxstore.errors",
    "StoreClosedError": "ctxstore.errors",
    "StoreUnavailableError": "ctxstore.errors",
    "StoredMessage": "ctxstore.models",
    "Summarizer": "ctxstore.summarizers",
    "SummarizerError": "ctxstore.errors",
    "SummarizerUnavailableError": "ctxstore.errors",
    "SummaryOutcome": "ctxstore.models",
    "SummaryStatus": "ctxstore.models",
    "TenantLimits": "ctxstore.models",
    "TiktokenCounter": "ctxstore.tokens",
    "TokenCounter": "ctxstore.tokens",
    "ViewStats": "ctxstore.models",
    "WriteResult": "ctxstore.models",
    "count_message": "ctxstore.tokens",
    "resolve_budget": "ctxstore.budget",
}
"""Each public name, and the module it lives in."""

__all__ = [
    "AnthropicSummarizer",
    "AppendResult",
    "Branch",
    "Budget",
    "BudgetExceededError",
    "Checkpoint",
    "Clock",
    "ConfigurationError",
    "ConflictError",
    "ContextStore",
    "CorruptEntryError",
    "CtxstoreError",
    "DecryptionError",
    "EmbeddedRedis",
    "EntryNotFoundError",
    "EpochChangedError",
    "ForgetIncompleteError",
    "ForkResult",
    "HistoryPage",
    "ImportResult",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "Keyring",
    "Lease",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "LocalSummarizer",
    "MalformedArchiveError",
    "Message",
    "MessageTooLargeError",
    "OpenAISummarizer",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RecallTools",
    "ReplicationError",
    "RequestView",
    "RewindResult",
    "SearchHit",
    "SessionExistsError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionSummary",
    "Settings",
    "StoreClosedError",
    "StoreContextManager",
    "StoreError",
    "StoreFullError",
    "StoreUnavailableError",
    "StoredMessage",
    "Summarizer",
    "SummarizerError",
    "SummarizerUnavailableError",
    "SummaryOutcome",
    "SummaryStatus",
    "TenantLimits",
    "TiktokenCounter",
    "TokenCounter",
    "ViewStats",
    "WriteResult",
    "count_message",
    "resolve_budget",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
