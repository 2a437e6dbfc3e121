"""ctxstore: a distributed, multi-tenant context store for LLM agents, on Redis.

Agent pods append each session's messages to a Redis Stream (lock-free,
idempotent), and before every model call read a budgeted, tool-safe view in
one round trip. See the README for the tour.
"""

from ctxstore.amplifier import StoreContextManager
from ctxstore.budget import Budget, resolve_budget
from ctxstore.embedded import EmbeddedRedis
from ctxstore.encryption import Keyring
from ctxstore.errors import (
    BudgetExceededError,
    ConfigurationError,
    ConflictError,
    CorruptEntryError,
    CtxstoreError,
    DecryptionError,
    InvalidIdError,
    InvalidInputError,
    InvalidMessageError,
    LeaseError,
    LeaseHeldError,
    LeaseLostError,
    MessageTooLargeError,
    QuotaExceededError,
    ReplicationError,
    SessionNotFoundError,
    StoreError,
    StoreUnavailableError,
    SummarizerError,
    SummarizerUnavailableError,
)
from ctxstore.lease import Clock, Lease
from ctxstore.models import (
    AppendResult,
    HistoryPage,
    Message,
    RequestView,
    SessionInfo,
    SessionSummary,
    StoredMessage,
    SummaryOutcome,
    TenantLimits,
    ViewStats,
    WriteResult,
)
from ctxstore.settings import Settings
from ctxstore.store import ContextStore
from ctxstore.summarizers import AnthropicSummarizer, LocalSummarizer, Summarizer
from ctxstore.tokens import TiktokenCounter, TokenCounter, count_message

__all__ = [
    "AnthropicSummarizer",
    "AppendResult",
    "Budget",
    "BudgetExceededError",
    "Clock",
    "ConfigurationError",
    "ConflictError",
    "ContextStore",
    "CorruptEntryError",
    "CtxstoreError",
    "DecryptionError",
    "EmbeddedRedis",
    "HistoryPage",
    "InvalidIdError",
    "InvalidInputError",
    "InvalidMessageError",
    "Keyring",
    "Lease",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "LocalSummarizer",
    "Message",
    "MessageTooLargeError",
    "QuotaExceededError",
    "ReplicationError",
    "RequestView",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionSummary",
    "Settings",
    "StoreContextManager",
    "StoreError",
    "StoreUnavailableError",
    "StoredMessage",
    "Summarizer",
    "SummarizerError",
    "SummarizerUnavailableError",
    "SummaryOutcome",
    "TenantLimits",
    "TiktokenCounter",
    "TokenCounter",
    "ViewStats",
    "WriteResult",
    "count_message",
    "resolve_budget",
]
