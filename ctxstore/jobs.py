"""The summary queue, under its former name: :mod:`ctxstore.summary_queue` is where it lives.

(Not `ctxstore.queue`: a module named `queue` shadows the standard library's when the
package directory is on sys.path, as when amplifier-core validates ctxstore/amplifier.py.)
"""

from ctxstore.summary_queue import (
    JOB_FUNCTION as JOB_FUNCTION,
)
from ctxstore.summary_queue import (
    LIVE as LIVE,
)
from ctxstore.summary_queue import (
    QUEUE_BACKOFF_MS as QUEUE_BACKOFF_MS,
)
from ctxstore.summary_queue import (
    Handoff as Handoff,
)
from ctxstore.summary_queue import (
    JobState as JobState,
)
from ctxstore.summary_queue import (
    SummaryDue as SummaryDue,
)
from ctxstore.summary_queue import (
    SummaryQueue as SummaryQueue,
)
from ctxstore.summary_queue import (
    deserialize as deserialize,
)
from ctxstore.summary_queue import (
    job_id as job_id,
)
from ctxstore.summary_queue import (
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
