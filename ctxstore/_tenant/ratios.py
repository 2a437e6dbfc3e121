"""A tenant's learned token ratios: how many of a model's tokens one stored token is.

Budgets are in the model's tokens and stored counts are cl100k; the
configured per-family guess is replaced, per tenant and model, by the ratio
the provider's usage reports show (:meth:`Ratios.usage`), and grown when
it refuses a view as too long (:meth:`Ratios.overflow`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import pairs
from ctxstore._layout.validate import check_model, check_usage
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.quotas import LIMITS_TTL
from ctxstore.lease import clock_arg
from ctxstore.tokens import safety_factor

if TYPE_CHECKING:
    from ctxstore._parts.scope import Scope
    from ctxstore.models import RequestView

__all__ = ["Ratios"]

log = logging.getLogger("ctxstore.tenancy")  # the name it had before the split: log configs use it


class Ratios:
    """A tenant's learned factors: how many of a model's tokens one stored token is.

    Budgets are in the model's tokens and stored counts are cl100k; the
    configured per-family factor (``token_safety_factors``) is a guess that
    ``record_usage`` replaces with each model's observed ratio plus a margin,
    per tenant, in Redis (bounded: 64 models, each between 1 and 4). Read and
    cached like the limits; a process's own reports apply to it at once.
    """

    SMOOTHING = 0.2
    STEP = 0.05
    MODELS = 64

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self._key = _keys.tenant_ratios_key(scope.prefix, scope.tenant)
        self._cached: tuple[float, dict[str, float]] | None = None

    async def factors(self) -> dict[str, float]:
        """Model -> the factor in force (cached ``LIMITS_TTL``)."""
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < LIMITS_TTL:
            return self._cached[1]
        (raw,) = await self._scope.connection.transaction([("HGETALL", self._key)], key=self._key)
        found = {}
        for model, value in pairs(raw).items():
            try:
                found[model] = min(4.0, max(1.0, float(value.split(" ", 1)[0])))
            except ValueError:
                log.warning("%s: skipped a malformed ratio for %r", self._key, model)
        self._cached = (now, found)
        return found

    async def report(self, model: str, kind: str, provider: int = 0, stored: int = 0) -> float:
        """Record a usage report or an overflow; the factor now in force for ``model``."""
        settings = self._scope.settings
        start = (await self.factors()).get(model) or safety_factor(
            settings.token_safety_factors, model
        )
        factor = float(
            await self._scope.connection.script(
                SCRIPTS.ratio,
                (self._key,),
                (
                    model,
                    kind,
                    provider,
                    stored,
                    start,
                    settings.token_ratio_margin,
                    self.SMOOTHING,
                    self.STEP,
                    self.MODELS,
                    clock_arg(self._scope.clock),
                ),
            )
        )
        cached = self._cached[1] if self._cached is not None else {}
        self._cached = (time.monotonic(), {**cached, model: factor})  # at once, here
        return factor

    async def usage(
        self, view: RequestView, input_tokens: int, model: str, overhead_tokens: int
    ) -> float:
        """Learn ``model``'s ratio from what the provider billed for ``view``; the factor now.

        See ``ContextStore.record_usage``.

        Raises:
            InvalidInputError: The report is malformed (nothing is recorded).
        """
        tokens = check_usage(view, input_tokens, overhead_tokens, model)
        return await self.report(model, "usage", input_tokens - overhead_tokens, tokens)

    async def overflow(self, model: str) -> float:
        """The provider refused a view for ``model`` as too long: the (larger) factor now.

        See ``ContextStore.record_overflow``.

        Raises:
            InvalidInputError: ``model`` cannot name a model.
        """
        check_model(model)
        return await self.report(model, "overflow")
