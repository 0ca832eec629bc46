"""The provider contract: what an adapter for an external system must offer.

``execute`` performs the effect at most once per idempotency key (same key + same payload
returns the original result; a different payload under the key is refused), and ``lookup``
answers whether the provider has a result for a key. ``lookup_complete`` says whether "not
found" is proof that the effect never happened, and ``retention_s`` how long results stay
looked up by key (the contract kit checks it against the retry and reconciliation window).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from effectlog.model import Outcome


class LookupStatus(StrEnum):
    CONFIRMED = "confirmed"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class LookupResult:
    """A provider's answer about one key; ``outcome`` is set when CONFIRMED.

    ``payload_hash`` is the payload identity the provider stored under the key, when it
    knows it, so a reconciler can refuse a result that belongs to another payload.
    """

    status: LookupStatus
    outcome: Outcome | None = None
    detail: str = ""
    payload_hash: str | None = None


class ProviderError(Exception):
    """Base for errors a provider adapter raises."""


class ProviderFailed(ProviderError):
    """The provider definitively refused or failed the effect: record FAILED, do not retry."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class ProviderTimeout(ProviderError):
    """No answer in time: the effect may or may not have happened (becomes UNKNOWN)."""


class ProviderUnavailable(ProviderError):
    """The provider could not be reached; nothing is known about the effect."""


class ProviderConflict(ProviderError):
    """The key was reused with a different payload, target or kind, or is in flight."""


class FencedByProvider(ProviderError):
    """The provider saw a higher fencing epoch for this key and refused the call."""


@runtime_checkable
class Provider(Protocol):
    """An adapter to one external system (mail, payments, tickets, browser, deploys)."""

    lookup_complete: bool
    retention_s: float

    def execute(self, target: str, payload_hash: str, idempotency_key: str,
                fencing_epoch: int, payload: Any) -> Any:
        """Perform the effect (at most once per key) and return the provider's result."""
        ...

    def lookup(self, idempotency_key: str) -> LookupResult:
        """What the provider knows about ``idempotency_key``."""
        ...
