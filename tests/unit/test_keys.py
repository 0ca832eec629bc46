from __future__ import annotations

import pytest

from effectlog.errors import InvalidInput
from effectlog.keys import (
    MAX_KEY_BYTES,
    canonical_payload,
    make_key,
    payload_hash,
    split_key,
    validate_key,
)


def test_key_binds_operation_kind_and_target() -> None:
    assert make_key("op-1", "email.send", "mailto:a@example.com") == (
        "agent:op-1:email.send:mailto:a@example.com")


def test_target_may_contain_colons_and_round_trips() -> None:
    key = make_key("op-1", "deploy.release", "k8s:prod:api")
    assert split_key(key) == ("op-1", "deploy.release", "k8s:prod:api")


def test_payload_hash_ignores_key_order_and_whitespace() -> None:
    assert payload_hash({"a": 1, "b": [1, 2]}) == payload_hash({"b": [1, 2], "a": 1})
    assert canonical_payload({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


def test_payload_hash_differs_for_different_payloads() -> None:
    assert payload_hash({"amount": 10}) != payload_hash({"amount": 11})


@pytest.mark.parametrize("payload", [float("nan"), {"x": object()}, {1j}])
def test_non_json_payload_is_invalid_input(payload: object) -> None:
    with pytest.raises(InvalidInput):
        payload_hash(payload)


@pytest.mark.parametrize("key", [
    "", "agent:", "agent:op", "agent:op:kind", "other:op:kind:t", "agent::kind:t",
    "agent:op:kind:t\x00", "agent:op:kind:t\n", "agent:op:kind:" + "x" * MAX_KEY_BYTES,
])
def test_malformed_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidInput):
        validate_key(key)


def test_key_at_the_byte_limit_is_accepted_and_one_more_is_not() -> None:
    prefix = "agent:op:k:"
    validate_key(prefix + "x" * (MAX_KEY_BYTES - len(prefix)))
    with pytest.raises(InvalidInput, match="512"):
        validate_key(prefix + "x" * (MAX_KEY_BYTES - len(prefix) + 1))


def test_multibyte_targets_count_bytes_not_characters() -> None:
    with pytest.raises(InvalidInput):
        make_key("op", "k", "é" * 300)


@pytest.mark.parametrize(("operation_id", "kind", "target"), [
    ("op:1", "email.send", "t"), ("", "email.send", "t"), ("op", "Email", "t"),
    ("op", "email send", "t"), ("op", "email.send", ""), ("op", "email.send", " t"),
    ("op", "email.send", "a\tb"), ("op", "email\x07", "t"), ("op", "email.send", "a\u2028b"),
    ("op\n", "email.send", "t"),
])
def test_bad_parts_are_rejected_before_anything_is_written(operation_id: str, kind: str,
                                                         target: str) -> None:
    with pytest.raises(InvalidInput):
        make_key(operation_id, kind, target)
