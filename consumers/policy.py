"""Approval policy per kind: may an ambiguous effect be retried without a person?

Auto-retry is opt-in per kind prefix and only ever applies to a provider that is idempotent
by key (every provider that passes the contract kit is) with complete lookup. Payment and
browser actions are never auto-retried unless named explicitly in ``allow_risky``.
"""

from __future__ import annotations

from dataclasses import dataclass

RISKY_PREFIXES = ("payment", "browser")


def _matches(kind: str, prefixes: tuple[str, ...]) -> bool:
    return any(kind == p or kind.startswith(p) for p in prefixes)


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """Which kinds may be retried by policy when the lookup stays ambiguous."""

    auto_retry: tuple[str, ...] = ()     # kind prefixes, e.g. ("email.", "ticket.create")
    allow_risky: tuple[str, ...] = ()    # explicit opt-in for payment*/browser* kinds
    actor: str = "policy"                # recorded as Approval.by

    def allows_auto_retry(self, kind: str, lookup_complete: bool) -> bool:
        """True when ``kind`` is opted in, not risky (or explicitly allowed), and the
        provider's lookup is complete."""
        if not lookup_complete or not _matches(kind, self.auto_retry):
            return False
        return not _matches(kind, RISKY_PREFIXES) or _matches(kind, self.allow_risky)

    def risky(self, kind: str) -> bool:
        """Payment and browser kinds, unless explicitly opted in with ``allow_risky``."""
        return _matches(kind, RISKY_PREFIXES) and not _matches(kind, self.allow_risky)

    def reason(self, kind: str) -> str:
        """The Approval.reason written when the policy retries ``kind``."""
        return f"auto-retry policy for {kind}: provider is idempotent by key with complete lookup"
