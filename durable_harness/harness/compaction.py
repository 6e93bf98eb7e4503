"""The compaction budget a harness works with, decided once when it is built.

Auto-compaction triggers above ``limit = context_window - compact_reserve`` tokens
(``design/context.md``) and keeps about ``keep_recent_tokens``. When that is ``>= limit`` no
compaction can get under the limit, so every checkpoint would compact again (issue 20): such
settings are clamped once, to ``limit // 2`` (room for the turns that follow), with one
warning per harness naming the values. A window at or under the reserve never auto-compacts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("durable_harness.harness")


@dataclass(frozen=True)
class CompactionBudget:
    """Attributes:
    limit: tokens the context may hold before auto-compaction (window minus reserve).
    keep_recent_tokens: tokens a compaction keeps verbatim (after any clamp).
    clamped_from: the configured ``keep_recent_tokens`` when it was clamped, else ``None``.
    reason: why it was clamped, in words (``None`` when not).
    """

    limit: int
    keep_recent_tokens: int
    clamped_from: int | None = None
    reason: str | None = None


def compaction_budget(
    context_window: int, compact_reserve: int, keep_recent_tokens: int
) -> CompactionBudget:
    """Decide the budget (all values in tokens) and log a clamp once.

    Returns a :class:`CompactionBudget`: ``keep_recent_tokens`` unchanged when it is below
    ``context_window - compact_reserve`` (or when that is not positive), else clamped to half
    of it with ``reason`` saying so."""
    limit = context_window - compact_reserve
    if limit <= 0 or keep_recent_tokens < limit:
        return CompactionBudget(limit, keep_recent_tokens)
    kept = limit // 2
    reason = (
        f"keep_recent_tokens={keep_recent_tokens} is at or above context_window "
        f"{context_window} - compact_reserve {compact_reserve} = {limit}: a compaction could "
        f"not shrink the context, so {kept} tokens are kept instead"
    )
    log.warning("compaction settings clamped: %s", reason)
    return CompactionBudget(limit, kept, keep_recent_tokens, reason)
