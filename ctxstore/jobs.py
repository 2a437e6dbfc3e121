"""The summary queue, under its former name: :mod:`ctxstore.queue` is where it lives."""

from ctxstore.queue import (
    JOB_FUNCTION as JOB_FUNCTION,
)
from ctxstore.queue import (
    LIVE as LIVE,
)
from ctxstore.queue import (
    QUEUE_BACKOFF_MS as QUEUE_BACKOFF_MS,
)
from ctxstore.queue import (
    Handoff as Handoff,
)
from ctxstore.queue import (
    JobState as JobState,
)
from ctxstore.queue import (
    SummaryDue as SummaryDue,
)
from ctxstore.queue import (
    SummaryQueue as SummaryQueue,
)
from ctxstore.queue import (
    deserialize as deserialize,
)
from ctxstore.queue import (
    job_id as job_id,
)
from ctxstore.queue import (
    serialize as serialize,
)

__all__ = [
    "JOB_FUNCTION",
    "LIVE",
    "QUEUE_BACKOFF_MS",
    "Handoff",
    "JobState",
    "SummaryDue",
    "SummaryQueue",
    "deserialize",
    "job_id",
    "serialize",
]
