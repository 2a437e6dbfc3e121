"""Forgetting a tenant: every session of it, then the tenant's own keys.

The walk follows the tenant's index (never ``KEYS`` or ``SCAN``), so it
costs what the tenant holds, not what the database holds; what it cannot
delete is reported after everything else went (:class:`ForgetIncompleteError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxstore._layout import keys as _keys
from ctxstore._layout.chain import segments_of
from ctxstore._layout.codec import Meta, text
from ctxstore._tenant.index import valid_id
from ctxstore._tenant.staged import StagedImports
from ctxstore.errors import CtxstoreError, ForgetIncompleteError, StoreError

if TYPE_CHECKING:
    from ctxstore._parts.lineage import Lineage
    from ctxstore._parts.scope import Scope
    from ctxstore._plan.warm import WarmViews
    from ctxstore._tenant.index import TenantIndex
    from ctxstore._tenant.quotas import Quotas
    from ctxstore.summary_queue import Handoff

__all__ = ["forget_tenant"]


async def forget_tenant(
    scope: Scope,
    index: TenantIndex,
    quotas: Quotas,
    jobs: Handoff,
    lineage: Lineage,
    warm: WarmViews,
) -> int:
    """Delete every session of the tenant, then the tenant's own keys.

    First the views this process keeps of the tenant (``warm``) are dropped.
    Walks the tenant's index (never ``KEYS`` or ``SCAN``), deleting each
    session's keys (its tombstone included: nothing of it is left), the
    segments it reads (its chain's and its branches') and its last summary
    job's arq keys (``jobs``), then the sessions deleted earlier (what their
    deletes left: tombstones, idempotency records), then every segment the
    tenant's registry still lists (those whose readers all went), then the
    index, its pending reservations, the tenant's limits and its entry in
    the tenants set.
    What cannot be deleted (a job on an unreachable queue, the limits a
    tenant's own user may not touch) does not stop the walk, but is reported.
    Members that are not valid ids (a tenant's own user may add some) are
    removed. Stop the tenant's writers first: a session created while the
    walk runs may be missed.

    Returns:
        The number of sessions deleted.

    Raises:
        ForgetIncompleteError: Something could not be deleted (after
            everything else was); it says what, and how many sessions went.
    """
    warm.discard_tenant(scope.tenant)
    connection = scope.connection
    removed = 0
    left: list[str] = []
    first_error: CtxstoreError | None = None
    while True:
        (names,) = await connection.transaction([("ZRANGE", index.key, 0, 199)], key=index.key)
        if not names:
            break
        members = [text(raw) for raw in names]
        for session in filter(valid_id, members):
            keys = scope.keys(session)
            generation, chain, branches, deleted = await connection.transaction(
                [
                    ("HGET", keys.meta, Meta.SUMMARY_GENERATION),
                    ("HGET", keys.meta, Meta.CHAIN),
                    ("HVALS", keys.branches),
                    ("UNLINK", *keys.all()),
                ],
                session=session,
                key=keys.meta,
            )
            removed += int(deleted) > 0
            await lineage.delete(segments_of(chain, branches))
            if generation:
                try:
                    await jobs.forget_job(scope.tenant, session, int(generation))
                except CtxstoreError as exc:
                    first_error = first_error or exc
                    left.append(f"the summary job of {session}")
        await index.unlist(0, [(member, "") for member in members], force=True)
    # Sessions deleted earlier: their tombstones and idempotency records.
    while True:
        (names,) = await connection.transaction(
            [("ZRANGE", index.deleted_key, 0, 199)], key=index.deleted_key
        )
        if not names:
            break
        members = [text(raw) for raw in names]
        for session in filter(valid_id, members):
            keys = scope.keys(session)
            await connection.transaction([("UNLINK", *keys.all())], session=session, key=keys.meta)
        await connection.transaction([("ZREM", index.deleted_key, *members)], key=index.deleted_key)
    await lineage.delete_registered()
    staged = StagedImports(scope)
    await staged.drop()  # imports in progress, or left by a pod that died during one
    ratios = _keys.tenant_ratios_key(scope.prefix, scope.tenant)
    await connection.transaction([("UNLINK", *index.keys, ratios, staged.key)], key=index.key)
    # A tenant's own ACL user may neither change its limits nor the tenants
    # set: only an operator's forget removes them.
    for command, key, what in (
        (("DEL", quotas.key), quotas.key, "the tenant's limits"),
        (
            ("SREM", index.tenants_key, scope.tenant),
            index.tenants_key,
            "its entry in the tenants set",
        ),
    ):
        try:
            await connection.transaction([command], key=key)
        except StoreError as exc:
            first_error = first_error or exc
            left.append(what)
    quotas.forget()
    index.forget()
    if left:
        raise ForgetIncompleteError(removed, tuple(left), tenant=scope.tenant) from first_error
    return removed
