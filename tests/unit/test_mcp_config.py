"""The pure parts of ``effectlog mcp``: the config file, target templates, operation ids, the
records kept for results, and how the ``mcp:`` provider reads a lookup tool's answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from consumers.providers.mcp_tools import found
from effectlog.errors import InvalidInput
from effectlog.mcp import results
from effectlog.mcp.config import check_tools, load_config, parse_config
from effectlog.mcp.operations import OperationIds, as_operation_id, client_key
from effectlog.mcp.template import Template
from effectlog.model import State

CONFIG = {
    "upstream": {"command": "python -m payments", "timeout": "30s", "retention": "7d"},
    "effects": {"charge": {"kind": "payment.charge", "target": "customer:{customer}",
                           "exclude": ["note"], "secret": ["card"], "operation_id": "order_id",
                           "key_argument": "idempotency_key", "lookup": "find_charge"}},
}
SCHEMAS = {"charge": {"properties": {"customer": {}, "amount": {}, "note": {}, "card": {},
                                     "order_id": {}, "idempotency_key": {}}},
           "find_charge": {"properties": {"idempotency_key": {}}}}


def with_effect(**changes: Any) -> dict[str, Any]:
    effect = {**CONFIG["effects"]["charge"], **changes}
    return {**CONFIG, "effects": {"charge": {k: v for k, v in effect.items() if v is not None}}}


def test_a_config_is_read_into_typed_settings() -> None:
    config = parse_config(CONFIG)
    charge = config.effects["charge"]
    assert config.upstream.command == ("python", "-m", "payments")
    assert config.upstream.timeout_s == 30 and config.upstream.retention_s == 7 * 86400
    assert charge.payload_ref == "withheld:card"
    assert charge.payload({"customer": "c", "note": "n", "idempotency_key": "x", "card": "4"}) \
        == {"customer": "c", "card": "4"}
    assert config.by_kind("payment.charge") is charge
    check_tools(config, SCHEMAS)


@pytest.mark.parametrize(("changes", "says"), [
    ({"kind": "Payment Charge"}, "invalid kind"),
    ({"target": "customer:{customer!r}"}, "no format spec"),
    ({"target": "customer:{"}, "bad target template"),
    ({"target": None}, "target is required"),
    ({"exclude": "note"}, "must be a list"),
    ({"exclude": ["idempotency_key"]}, "set by the proxy"),
    ({"lookup_complete": "yes"}, "true or false"),
    ({"kidn": "x"}, "unknown key(s) kidn"),
])
def test_a_malformed_effect_is_refused_with_one_line(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config(with_effect(**changes))
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("changes", "says"), [
    ({"target": "customer:{cust}"}, "target names argument(s) cust"),
    ({"operation_id": "order"}, "operation_id names argument(s) order"),
    ({"lookup": "find"}, "no lookup tool 'find'"),
    ({"lookup_argument": "key"}, "takes no argument 'key'"),
])
def test_a_config_naming_what_the_upstream_lacks_is_refused(changes: dict[str, Any],
                                                            says: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_tools(parse_config(with_effect(**changes)), SCHEMAS)
    assert says in str(caught.value)


def test_an_unknown_tool_is_refused_naming_the_tools_there_are() -> None:
    config = parse_config({**CONFIG, "effects": {"refund": CONFIG["effects"]["charge"]}})
    with pytest.raises(InvalidInput, match=r"no tool .refund. .*charge, find_charge"):
        check_tools(config, SCHEMAS)


def test_two_tools_of_one_kind_are_refused() -> None:
    effect = CONFIG["effects"]["charge"]
    with pytest.raises(InvalidInput, match=r"kind .payment\.charge. is used by tools"):
        parse_config({**CONFIG, "effects": {"a": effect, "b": effect}})


def test_the_upstream_is_a_command_or_a_url(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not both"):
        parse_config({"upstream": {"command": ["x"], "url": "http://127.0.0.1:1/mcp"}})
    with pytest.raises(InvalidInput, match="must be an http"):
        parse_config({"upstream": {"url": "ftp://x"}})
    (tmp_path / "bad.toml").write_text("[upstream\n")
    with pytest.raises(InvalidInput, match="is not TOML"):
        load_config(tmp_path / "bad.toml")
    with pytest.raises(InvalidInput, match="no config file"):
        load_config(tmp_path / "missing.toml")
    config = parse_config(CONFIG).with_upstream(url="http://127.0.0.1:9/mcp")
    assert config.upstream.url and not config.upstream.command


def test_a_template_renders_arguments_and_nested_fields() -> None:
    template = Template.parse("acct:{account.id}/{currency}{{x}}")
    assert template.arguments == {"account", "currency"}
    assert template.render({"account": {"id": 7}, "currency": "EUR"}) == "acct:7/EUR{x}"
    with pytest.raises(InvalidInput, match="'currency' is needed"):
        template.render({"account": {"id": 7}})


def test_operation_ids_come_from_the_client_key_then_the_argument_then_the_run() -> None:
    effect = parse_config(CONFIG).effects["charge"]
    ids = OperationIds("run-9")
    keyed = {"idempotencyKey": "k-1", "arguments": {"order_id": "o-1"}}
    assert ids.for_call(effect, keyed, "t").operation_id == "k-1"
    in_meta = {"_meta": {"idempotencyKey": "k-2"}, "arguments": {"order_id": "o-1"}}
    assert ids.for_call(effect, in_meta, "t").operation_id == "k-2"
    assert ids.for_call(effect, {"arguments": {"order_id": 55}}, "t").operation_id == "55"
    numbered = [ids.for_call(effect, {"arguments": {}}, t).operation_id for t in "aab"]
    assert numbered == ["run-9.1", "run-9.2", "run-9.1"]
    own_run = {"arguments": {}, "_meta": {"effectlog/runId": "job-3"}}
    assert ids.for_call(effect, own_run, "a").operation_id == "job-3.1"
    with pytest.raises(InvalidInput, match="invalid run id"):
        ids.for_call(effect, {"_meta": {"effectlog/runId": "no spaces"}}, "a")


def test_any_client_key_maps_to_one_stable_operation_id() -> None:
    assert as_operation_id("uuid-like-1") == "uuid-like-1"
    odd = as_operation_id("order 17 / retry")
    assert odd == as_operation_id("order 17 / retry") and odd.startswith("h-")
    with pytest.raises(InvalidInput, match="non-empty string"):
        client_key({"idempotencyKey": 17})


def test_a_result_is_kept_without_the_sdks_own_meta_and_given_back_the_same() -> None:
    answer = types.CallToolResult(content=[types.TextContent(type="text", text="ok")],
                                  structured_content={"id": 1},
                                  _meta={"io.modelcontextprotocol/serverInfo": {"name": "u"},
                                         "trace": "t"})
    record = results.record_of(answer)
    assert record["_meta"] == {"trace": "t"} and "resultType" not in record
    again = results.tool_result(record, "agent:k:payment.charge:c", State.SUCCEEDED,
                                replayed=True)
    assert again.structured_content == {"id": 1}
    assert again.meta == {"trace": "t", "effectlog/idempotencyKey": "agent:k:payment.charge:c",
                          "effectlog/state": "SUCCEEDED", "effectlog/replayed": True}


def test_a_refusal_is_kept_and_raised_again() -> None:
    record = results.refusal_record(types.ErrorData(code=types.INVALID_PARAMS, message="bad"))
    with pytest.raises(MCPError, match="bad") as caught:
        results.tool_result(record, "agent:k:a.b:c", State.FAILED, replayed=True)
    assert caught.value.code == types.INVALID_PARAMS


@pytest.mark.parametrize(("structured", "content", "is_found"), [
    (None, [], False),
    ({"found": False}, [], False),
    (None, [{"type": "text", "text": "null"}], False),
    (None, [{"type": "text", "text": '{"found": false}'}], False),
    ({"charge_id": "ch_1"}, [], True),
    (None, [{"type": "text", "text": "charge ch_1, 12 EUR"}], True),
    (None, [{"type": "text", "text": '{"id": 1}'}], True),
])
def test_a_lookup_tool_answer_is_found_unless_empty_null_or_found_false(
        structured: Any, content: list[Any], is_found: bool) -> None:
    assert found(structured, content) is is_found
