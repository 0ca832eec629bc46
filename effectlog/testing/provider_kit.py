"""The provider contract kit: run DESIGN.md's five checks against your own provider.

In your test suite::

    from effectlog.testing.provider_kit import ProviderContract

    class TestMyProvider(ProviderContract):
        retention_window_s = 3 * 24 * 3600      # your max retry + reconciliation window

        @pytest.fixture
        def provider(self):
            return MyProvider(sandbox_url)

        @pytest.fixture
        def simulate_timeout(self, provider):   # optional: next call performs, then times out
            return lambda: provider.fail_next_response()

The checks: same key + same payload returns the original result; same key + another payload
is rejected; a timed-out request can be looked up by key; a key cannot be reused for another
target or operation type; results are retained longer than the window (and, with the
optional ``reopen`` fixture, survive a restart of the provider).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from effectlog.keys import make_key, payload_hash
from effectlog.provider import (
    LookupStatus,
    Provider,
    ProviderConflict,
    ProviderFailed,
    ProviderTimeout,
)

#: Arrange for the provider's next ``execute`` to perform the effect, then time out.
SimulateTimeout = Callable[[], None]
#: Open a new provider instance on the same storage (a provider restart).
Reopen = Callable[[], Provider]
#: ``(operation, target, payload_hash, key, epoch, payload)``: execute under an explicit
#: operation type (for providers that take it apart from the key, e.g. an HTTP path).
OtherOperation = Callable[[str, str, str, str, int, Any], Any]


class ProviderContract:
    """Base class of a provider's contract tests; subclass it and provide ``provider``."""

    #: The longest time an effect may wait for a retry or reconciliation (seconds).
    retention_window_s: float = 7 * 24 * 3600.0
    kind = "contract.check"
    target = "contract-target-1"
    other_target = "contract-target-2"
    other_kind = "contract.other"

    # -- fixtures a subclass provides ----------------------------------------------------

    @pytest.fixture
    def provider(self) -> Provider:
        raise NotImplementedError("provide a `provider` fixture")

    @pytest.fixture
    def simulate_timeout(self) -> SimulateTimeout | None:
        return None

    @pytest.fixture
    def reopen(self) -> Reopen | None:
        return None

    @pytest.fixture
    def other_operation(self) -> OtherOperation | None:
        return None

    # -- helpers a subclass may override -------------------------------------------------

    def payload(self, variant: int = 1) -> Any:
        """A payload the provider accepts; different variants must differ."""
        return {"contract": "effectlog", "variant": variant}

    def new_key(self, kind: str | None = None, target: str | None = None) -> str:
        return make_key(f"contract-{uuid.uuid4().hex[:16]}", kind or self.kind,
                        target or self.target)

    def run(self, provider: Provider, key: str, variant: int = 1, *, target: str | None = None,
            epoch: int = 1) -> Any:
        body = self.payload(variant)
        return provider.execute(target or self.target, payload_hash(body), key, epoch, body)

    # -- 1. same key + same payload returns the original result --------------------------

    def test_same_key_and_payload_returns_the_original_result(self, provider: Provider) -> None:
        key = self.new_key()
        first = self.run(provider, key)
        assert self.run(provider, key) == first
        assert self.run(provider, key, epoch=2) == first

    def test_lookup_confirms_an_executed_key(self, provider: Provider) -> None:
        key = self.new_key()
        result = self.run(provider, key)
        found = provider.lookup(key)
        assert found.status is LookupStatus.CONFIRMED
        assert found.outcome is not None and found.outcome.result == result

    def test_lookup_of_an_unused_key_is_not_found(self, provider: Provider) -> None:
        found = provider.lookup(self.new_key())
        if provider.lookup_complete:
            assert found.status is LookupStatus.NOT_FOUND
        else:
            assert found.status in (LookupStatus.NOT_FOUND, LookupStatus.UNAVAILABLE)

    # -- 2. same key + different payload is rejected -------------------------------------

    def test_same_key_with_another_payload_is_rejected(self, provider: Provider) -> None:
        key = self.new_key()
        original = self.run(provider, key, 1)
        with pytest.raises(ProviderConflict):
            self.run(provider, key, 2)
        assert self.run(provider, key, 1) == original

    # -- 3. a timed-out request can be looked up by key ----------------------------------

    def test_timed_out_request_can_be_looked_up_by_key(
            self, provider: Provider, simulate_timeout: SimulateTimeout | None) -> None:
        if simulate_timeout is None:
            pytest.skip("provide a `simulate_timeout` fixture to check lookups after timeouts")
        key = self.new_key()
        simulate_timeout()
        with pytest.raises(ProviderTimeout):
            self.run(provider, key)
        found = provider.lookup(key)
        assert found.status is LookupStatus.CONFIRMED, found
        assert found.outcome is not None
        assert self.run(provider, key) == found.outcome.result  # and no second effect

    # -- 4. a key cannot be reused for another target or operation type ------------------

    def test_key_cannot_be_reused_for_another_target(self, provider: Provider) -> None:
        key = self.new_key()
        self.run(provider, key)
        with pytest.raises((ProviderConflict, ProviderFailed)):
            self.run(provider, key, target=self.other_target)

    def test_key_cannot_be_reused_for_another_operation_type(
            self, provider: Provider, other_operation: OtherOperation | None) -> None:
        if other_operation is None:
            pytest.skip("the operation type is bound in the key only; provide "
                        "`other_operation` if the provider takes it separately")
        key = self.new_key()
        self.run(provider, key)
        body = self.payload(1)
        with pytest.raises((ProviderConflict, ProviderFailed)):
            other_operation(self.other_kind, self.target, payload_hash(body), key, 1, body)

    # -- 5. retention outlasts the retry and reconciliation window -----------------------

    def test_retention_covers_the_retry_and_reconciliation_window(self, provider: Provider) -> None:
        retention = getattr(provider, "retention_s", None)
        assert retention is not None, "the provider must declare retention_s"
        assert float(retention) >= self.retention_window_s, (
            f"results are kept {retention}s, less than the {self.retention_window_s}s window")

    def test_results_survive_reopening_the_provider(self, provider: Provider,
                                                    reopen: Reopen | None) -> None:
        if reopen is None:
            pytest.skip("provide a `reopen` fixture to check results survive a restart")
        key = self.new_key()
        result = self.run(provider, key)
        again = reopen()
        found = again.lookup(key)
        assert found.status is LookupStatus.CONFIRMED
        assert found.outcome is not None and found.outcome.result == result
        assert self.run(again, key) == result
