"""Both bundled providers pass the contract kit; plus what the fake and HTTP adapter add."""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumers.providers import load_provider
from consumers.providers.fake import FakeProvider
from consumers.providers.http import HttpProvider
from consumers.providers.http_server import FakeProviderServer
from consumers.providers.wire import decode_key, encode_key
from effectlog.errors import InvalidInput
from effectlog.keys import make_key, payload_hash
from effectlog.provider import (
    FencedByProvider,
    LookupStatus,
    Provider,
    ProviderConflict,
    ProviderFailed,
    ProviderTimeout,
    ProviderUnavailable,
)
from effectlog.testing.provider_kit import OtherOperation, ProviderContract, Reopen, SimulateTimeout


class TestFakeProvider(ProviderContract):
    @pytest.fixture
    def fake(self, tmp_path: Path) -> FakeProvider:
        return FakeProvider(tmp_path / "provider.db")

    @pytest.fixture
    def provider(self, fake: FakeProvider) -> Provider:
        return fake

    @pytest.fixture
    def simulate_timeout(self, fake: FakeProvider) -> SimulateTimeout:
        return fake.inject_timeout_after_accept

    @pytest.fixture
    def reopen(self, fake: FakeProvider) -> Reopen:
        return fake.reopen

    @pytest.fixture
    def other_operation(self, fake: FakeProvider) -> OtherOperation:
        return fake.execute_operation


class TestHttpProvider(ProviderContract):
    @pytest.fixture
    def server(self, tmp_path: Path) -> Iterator[FakeProviderServer]:
        server = FakeProviderServer(FakeProvider(tmp_path / "provider.db")).start()
        yield server
        server.close()

    @pytest.fixture
    def provider(self, server: FakeProviderServer) -> Provider:
        return HttpProvider.from_url(server.url + "?timeout_s=5")

    @pytest.fixture
    def simulate_timeout(self, server: FakeProviderServer) -> SimulateTimeout:
        return server.provider.inject_timeout_after_accept

    @pytest.fixture
    def reopen(self, server: FakeProviderServer) -> Reopen:
        return lambda: HttpProvider.from_url(server.url)

    @pytest.fixture
    def other_operation(self, provider: HttpProvider) -> OtherOperation:
        return provider.execute_operation


# -- the fake's own promises ---------------------------------------------------------------

KEY = make_key("op-1", "email.send", "mailto:b@example.com")
BODY = {"subject": "hi"}
HASH = payload_hash(BODY)


def call(provider: Any, epoch: int = 1, body: Any = BODY, key: str = KEY) -> Any:
    return provider.execute("mailto:b@example.com", payload_hash(body), key, epoch, body)


def test_fake_counts_one_execution_per_key_however_often_called(tmp_path: Path) -> None:
    fake = FakeProvider(tmp_path / "p.db")
    results = {json.dumps(call(fake, epoch), sort_keys=True) for epoch in (1, 1, 2, 3)}
    assert len(results) == 1
    assert fake.executions(KEY) == 1 and fake.calls(KEY) == 4


def test_fake_refuses_a_lower_fencing_epoch_than_it_has_seen(tmp_path: Path) -> None:
    fake = FakeProvider(tmp_path / "p.db")
    call(fake, epoch=3)
    with pytest.raises(FencedByProvider):
        call(fake, epoch=2)


def test_fake_lookup_outage_lasts_n_lookups(tmp_path: Path) -> None:
    fake = FakeProvider(tmp_path / "p.db")
    call(fake)
    fake.inject_lookup_outage(2)
    statuses = [fake.lookup(KEY).status for _ in range(3)]
    assert statuses == [LookupStatus.UNAVAILABLE, LookupStatus.UNAVAILABLE, LookupStatus.CONFIRMED]


def test_fake_execute_outage_performs_nothing(tmp_path: Path) -> None:
    fake = FakeProvider(tmp_path / "p.db")
    fake.inject_execute_outage(1)
    with pytest.raises(ProviderUnavailable):
        call(fake)
    assert fake.executions(KEY) == 0 and fake.lookup(KEY).status is LookupStatus.NOT_FOUND


def test_fake_definitive_failure_is_stored_and_replayed(tmp_path: Path) -> None:
    fake = FakeProvider(tmp_path / "p.db")
    for _ in range(2):
        with pytest.raises(ProviderFailed) as info:
            call(fake, body={"_fake_fail": "mailbox full"})
        assert info.value.result == {"error": "mailbox full"}
    assert fake.executions(KEY) == 1


def test_fake_slowness_makes_a_concurrent_duplicate_a_conflict(tmp_path: Path) -> None:
    fake = FakeProvider(tmp_path / "p.db")
    fake.set_latency(0.5)
    first: list[Any] = []
    thread = threading.Thread(target=lambda: first.append(call(fake)))
    thread.start()
    while fake.calls(KEY) == 0:
        pass
    assert fake.lookup(KEY).status is LookupStatus.UNAVAILABLE  # still in flight
    with pytest.raises(ProviderConflict):
        call(FakeProvider(tmp_path / "p.db"))
    thread.join()
    assert first and fake.executions(KEY) == 1


def _hammer(path: str, n: int) -> None:
    fake = FakeProvider(path)
    for i in range(n):
        key = make_key(f"op-{i}", "email.send", "mailto:b@example.com")
        with contextlib.suppress(ProviderConflict):  # the other process's is in flight
            call(fake, key=key)


def test_fake_is_safe_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    FakeProvider(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(path, 40)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    fake = FakeProvider(path)
    assert fake.total_executions() == 40
    assert all(fake.executions(make_key(f"op-{i}", "email.send", "mailto:b@example.com")) == 1
               for i in range(40))


def test_naive_mode_performs_every_call(tmp_path: Path) -> None:
    naive = load_provider(f"fake:///{tmp_path}/naive.db?dedupe=0")
    call(naive)
    call(naive)
    assert isinstance(naive, FakeProvider) and naive.executions(KEY) == 2


# -- the HTTP adapter over a real socket ---------------------------------------------------

@pytest.fixture
def served(tmp_path: Path) -> Iterator[FakeProviderServer]:
    server = FakeProviderServer(FakeProvider(tmp_path / "h.db")).start()
    yield server
    server.close()


def raw_post(server: FakeProviderServer, headers: dict[str, str], body: dict[str, Any]
             ) -> tuple[int, dict[str, Any]]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("POST", "/effects/email.send", body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    return response.status, answer


def test_http_key_header_is_a_quoted_structured_string(served: FakeProviderServer) -> None:
    body = {"target": "mailto:b@example.com", "payload_hash": HASH, "payload": BODY}
    status, answer = raw_post(served, {"Idempotency-Key": f'"{KEY}"', "Fencing-Epoch": "1"}, body)
    assert status == 201 and answer["status"] == "SUCCEEDED"
    status, again = raw_post(served, {"Idempotency-Key": f'"{KEY}"', "Fencing-Epoch": "1"}, body)
    assert status == 200 and again["result"] == answer["result"]
    assert raw_post(served, {}, body)[0] == 400  # the key is required
    assert raw_post(served, {"Idempotency-Key": KEY}, body)[0] == 400  # and must be quoted


def test_http_key_reused_with_another_payload_is_422(served: FakeProviderServer) -> None:
    headers = {"Idempotency-Key": encode_key(KEY), "Fencing-Epoch": "1"}
    raw_post(served, headers, {"target": "mailto:b@example.com", "payload_hash": HASH,
                               "payload": BODY})
    status, answer = raw_post(served, headers, {"target": "mailto:b@example.com",
                                                "payload_hash": "f" * 64, "payload": {}})
    assert status == 422 and "another payload" in answer["detail"]


def test_http_concurrent_duplicate_in_flight_is_409(served: FakeProviderServer) -> None:
    served.provider.set_latency(0.5)
    adapter = HttpProvider.from_url(served.url)
    thread = threading.Thread(target=lambda: call(adapter))
    thread.start()
    while served.provider.calls(KEY) == 0:
        pass
    with pytest.raises(ProviderConflict, match="in flight"):
        call(adapter)
    thread.join()
    assert served.provider.executions(KEY) == 1


def test_http_stale_epoch_and_outages_map_to_provider_errors(served: FakeProviderServer) -> None:
    adapter = HttpProvider.from_url(served.url)
    call(adapter, epoch=5)
    with pytest.raises(FencedByProvider):
        call(adapter, epoch=4)
    served.provider.inject_lookup_outage(1)
    assert adapter.lookup(KEY).status is LookupStatus.UNAVAILABLE
    assert adapter.lookup(KEY).status is LookupStatus.CONFIRMED
    assert adapter.lookup_complete is True and adapter.retention_s >= 7 * 24 * 3600


def test_http_read_timeout_is_ambiguous_and_refused_connection_is_unavailable(
        served: FakeProviderServer) -> None:
    served.provider.set_latency(1.0)
    impatient = HttpProvider(served.url, timeout_s=0.2, lookup_complete=True, retention_s=1)
    with pytest.raises(ProviderTimeout):
        call(impatient)
    nobody = HttpProvider("http://127.0.0.1:9", timeout_s=0.5)
    with pytest.raises(ProviderUnavailable):
        call(nobody)
    assert nobody.lookup(KEY).status is LookupStatus.UNAVAILABLE


def test_key_encoding_round_trips_non_ascii_and_quotes() -> None:
    key = make_key("op", "email.send", 'mailto:zoë@example.com?s="x"\\y%z')
    header = encode_key(key)
    assert header.isascii() and header.startswith('"') and header.endswith('"')
    assert decode_key(header) == key
    with pytest.raises(InvalidInput):
        decode_key(None)


def test_load_provider_specs(tmp_path: Path) -> None:
    fake = load_provider(f"fake:///{tmp_path}/f.db?lookup_complete=0&retention_s=60")
    assert isinstance(fake, FakeProvider) and not fake.lookup_complete and fake.retention_s == 60
    user = load_provider("tests.unit.test_provider_contract:make_user_provider")
    assert isinstance(user, FakeProvider)
    for bad in ("nonsense", "no.such.module:factory", "https://x"):
        with pytest.raises(InvalidInput):
            load_provider(bad)


def make_user_provider() -> FakeProvider:
    """A user's adapter factory, as `module:factory` names it."""
    import tempfile

    return FakeProvider(Path(tempfile.mkdtemp()) / "user.db")
