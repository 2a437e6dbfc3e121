"""The assembly of one tenant's parts: each built once over its scope, wired to those it uses.

:class:`~ctxstore.store.ContextStore` is built on :class:`Parts`, and each of
its methods calls the one part that owns the concept. Parts share state
(the tenant's cached limits, the segments whose TTL was stretched, what the
last view read), so each is built once per store and handed to the parts
that use it; what a process shares between its tenants' stores (the summary
queue's hand-off, the views it keeps) is given.
"""

from __future__ import annotations

from ctxstore._parts.anchor import Viewer
from ctxstore._parts.archive import Archive
from ctxstore._parts.branches import Branches
from ctxstore._parts.checkpoints import Checkpoints
from ctxstore._parts.edits import Editor
from ctxstore._parts.forks import Forks
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.reads import Reader
from ctxstore._parts.scope import Scope
from ctxstore._parts.search import Searcher
from ctxstore._parts.summary import Summaries
from ctxstore._parts.writes import Writer
from ctxstore._plan.warm import WarmViews
from ctxstore._tenant.index import TenantIndex
from ctxstore._tenant.quotas import Quotas
from ctxstore._tenant.ratios import Ratios
from ctxstore.summary_queue import Handoff

__all__ = ["Parts"]


class Parts:
    """One tenant's parts, as the (private) attributes of the store built on them.

    Args:
        scope: The tenant's scope.
        handoff: Where a due summary goes (shared by the process's stores).
        warm: The views this process keeps (shared by its tenants' stores).
    """

    def __init__(self, scope: Scope, handoff: Handoff, warm: WarmViews) -> None:
        self._scope = scope
        self._handoff = handoff
        self._quotas = Quotas(scope)
        self._ratios = Ratios(scope)
        self._index = TenantIndex(scope)
        self._lineage = Lineage(scope)
        self._reader = Reader(scope, self._lineage)
        self._summaries = Summaries(scope, self._reader, handoff)
        self._viewer = Viewer(scope, warm, self._lineage, self._ratios, self._summaries)
        tenancy = (self._quotas, self._index)
        self._writer = Writer(scope, *tenancy, handoff, self._lineage, warm)
        self._editor = Editor(scope, *tenancy, self._lineage, self._writer, warm)
        self._searcher = Searcher(scope, self._reader)
        self._checkpoints = Checkpoints(scope, self._quotas)
        self._branches = Branches(scope, self._quotas, self._lineage, self._checkpoints)
        held = (self._quotas, self._lineage, self._checkpoints)
        self._forks = Forks(scope, *held, self._writer, self._summaries, handoff)
        self._archive = Archive(scope, self._reader, self._writer, self._checkpoints, self._quotas)
