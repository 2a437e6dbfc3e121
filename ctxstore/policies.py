"""View planning and summary cuts, under their former module name.

Kept so that ``from ctxstore.policies import plan_view`` goes on working:
the planning is :mod:`ctxstore.view`, the summary cut and chunks are in
:mod:`ctxstore.summary`, entries in :mod:`ctxstore._codec`, and the tool
call ids of a message in :mod:`ctxstore._formats`.
"""

from ctxstore._codec import ENTRY_PLACEHOLDER, Entry, SummaryText
from ctxstore._formats import call_ids, entry_order, result_ids
from ctxstore.summary import summary_chunks, summary_cut
from ctxstore.view import ViewPlan, plan_view

__all__ = [
    "ENTRY_PLACEHOLDER",
    "Entry",
    "SummaryText",
    "ViewPlan",
    "call_ids",
    "entry_order",
    "plan_view",
    "result_ids",
    "summary_chunks",
    "summary_cut",
]
