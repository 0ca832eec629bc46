"""The web console over real HTTP: a node on a real SQLite log and RocksDB, urllib3 as the
client (the browser test drives the same pages in Chromium)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import urllib3

from consumers.console import ConsoleSettings, console_routes
from consumers.node.node import Node, NodeSettings
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog
from effectlog.view import LogView
from tests.console_support import MARKUP, Workload, fill, stale_record

pytestmark = pytest.mark.timeout(120)
TOKEN = "correct horse battery staple"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    handle = open_log(f"sqlite:///{tmp_path}/log.db")
    yield handle
    handle.close()


@pytest.fixture
def workload(log: EventLog) -> Workload:
    return fill(log)


def _node(tmp_path: Path, token: str | None, name: str = "state") -> Node:
    """A started node, once its partition serves (it restores first)."""
    node = Node(f"sqlite:///{tmp_path}/log.db", NodeSettings(state_dir=tmp_path / name, http_port=0),
                extra_routes=console_routes(ConsoleSettings(token=token, page_size=5))).start()
    deadline = time.monotonic() + 30
    while node.gate.serving() != [0]:
        assert time.monotonic() < deadline, "the node did not start serving"
        time.sleep(0.02)
    return node


@pytest.fixture
def node(tmp_path: Path, workload: Workload) -> Iterator[Node]:
    running = _node(tmp_path, TOKEN)
    yield running
    assert running.stop() == []
    running.close()


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager(retries=False, timeout=10)


def _get(http: urllib3.PoolManager, url: str, **headers: str) -> tuple[int, str]:
    answer = http.request("GET", url, headers=headers)
    return answer.status, answer.data.decode("utf-8")


def _page(node: Node, key: str) -> str:
    return f"{node.url}/effects/{quote(key, safe='')}"


def _login(http: urllib3.PoolManager, node: Node, token: str = TOKEN) -> tuple[int, str]:
    answer = http.request("POST", f"{node.url}/login", fields={"token": token, "next": "/"},
                          encode_multipart=False, headers={"Origin": node.url})
    return answer.status, answer.headers.get("Set-Cookie", "")


def _session(http: urllib3.PoolManager, node: Node, key: str) -> tuple[str, str]:
    """(cookie header, CSRF token of the key page) after logging in."""
    status, set_cookie = _login(http, node)
    assert status == 303, set_cookie
    cookie = set_cookie.split(";", 1)[0]
    _, page = _get(http, _page(node, key), Cookie=cookie)
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "no decision form for a logged-in session"
    return cookie, found.group(1)


def _decide(http: urllib3.PoolManager, node: Node, key: str, fields: dict[str, str],
            **headers: str) -> urllib3.BaseHTTPResponse:
    return http.request("POST", _page(node, key), fields=fields, encode_multipart=False,
                        headers=headers)


def test_overview_counts_and_lists_the_effects_in_doubt_first(node: Node,
                                                              http: urllib3.PoolManager) -> None:
    status, page = _get(http, node.url + "/")
    assert status == 200
    counts = re.findall(r"<b>([\d,]+)</b><span>([A-Z ]+)</span>", page)
    assert {label: int(n) for n, label in counts} == {
        "AWAITING APPROVAL": 2, "UNKNOWN": 5, "DISPATCHED": 1, "RESERVED": 0, "CREATED": 1,
        "FAILED": 0, "ABANDONED": 0, "SUCCEEDED": 12}
    assert "projector lag <b>0</b>" in page
    assert page.index("Awaiting approval") < page.index("Unknown") < page.index("payment.charge")
    assert "agent:run-0042-3:payment.charge:stripe:cus_ACME42" in page  # whole keys
    assert page.count('<td><span class="badge state-UNKNOWN">') == 5


def test_keys_reasons_and_payloads_are_escaped(node: Node, http: urllib3.PoolManager) -> None:
    status, page = _get(http, _page(node, MARKUP))
    assert status == 200
    assert "<b>ops</b>" not in page and "&lt;b&gt;ops&lt;/b&gt;" in page
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "\x1b" not in page and "crash \\x1b[31mred\\x1b[0m" in page
    assert "\u202e" not in page and "\\u202egnp.exe" in page  # the payload, bidi shown
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    overview = _get(http, node.url + "/")[1]
    assert "\x1b" not in overview and "<img src=x" not in overview


def test_the_timeline_shows_every_record_with_epochs_and_payload_identity(
        node: Node, http: urllib3.PoolManager, log: EventLog, workload: Workload) -> None:
    _, page = _get(http, _page(node, workload.payment))
    rows = re.findall(r"<tr class=\"[^\"]*\">(.*?)</tr>", page, re.S)
    assert [re.search(r"<td>([A-Z_]+)</td>", r).group(1) for r in rows] == [  # type: ignore[union-attr]
        "CREATE", "RESERVE", "DISPATCH", "UNKNOWN"]
    assert "provider timed out after 30s" in rows[-1] and "worker-2" in rows[-1]
    snapshot = LogView(log).current(workload.payment)
    assert snapshot is not None and f"sha256 {snapshot.payload_hash}" in page
    assert "&#34;invoice&#34;: &#34;INV-1042&#34;" in page  # the payload, on the log
    _, ref_page = _get(http, _page(node, "agent:run-0044-1:payment.refund:stripe:ch_9"))
    assert "vault://refunds/77" in ref_page and "payload as written" not in ref_page


def test_a_key_nobody_wrote_is_404_and_a_bad_key_400(node: Node, http: urllib3.PoolManager) -> None:
    assert _get(http, _page(node, "agent:nope:email.send:x"))[0] == 404
    assert _get(http, node.url + "/effects/not-a-key")[0] == 400
    status, page = _get(http, node.url + "/effects?state=NOPE")
    assert status == 400 and "state must be one of" in page


def test_lists_page_by_cursor_and_filter_by_kind_target_and_age(
        node: Node, http: urllib3.PoolManager) -> None:
    seen: list[str] = []
    url: str | None = node.url + "/effects?state=SUCCEEDED"
    for _ in range(10):
        assert url is not None
        status, page = _get(http, url)
        assert status == 200
        seen += re.findall(r'<td class="key"><a href="[^"]+">([^<]+)</a>', page)
        found = re.search(r'<a class="next" href="([^"]+)"', page)
        url = None if found is None else node.url + found.group(1).replace("&amp;", "&")
        if url is None:
            break
    assert len(seen) == len(set(seen)) == 12 and url is None
    api = json.loads(http.request("GET", f"{node.url}/v1/effects?state=SUCCEEDED&limit=20").data)
    assert seen == [e["idempotency_key"] for e in api]
    _, payments = _get(http, node.url + "/effects?state=UNKNOWN&kind=payment&target=BETA")
    assert re.findall(r'<td class="key"><a href="[^"]+">([^<]+)</a>', payments) == [
        "agent:run-0042-4:payment.charge:stripe:cus_BETA7"]
    _, none_older = _get(http, node.url + "/effects?state=UNKNOWN&older_than=1h")
    assert "Nothing." in none_older


def test_the_api_pages_by_cursor_with_the_next_header(node: Node,
                                                      http: urllib3.PoolManager) -> None:
    first = http.request("GET", f"{node.url}/v1/effects?state=SUCCEEDED&limit=5")
    rest = http.request("GET", f"{node.url}/v1/effects?state=SUCCEEDED&limit=20&after="
                        + quote(first.headers["Effectlog-Next"], safe=""))
    whole = json.loads(http.request("GET", f"{node.url}/v1/effects?state=SUCCEEDED").data)
    assert json.loads(first.data) + json.loads(rest.data) == whole
    assert "Effectlog-Next" not in rest.headers
    assert http.request("GET", f"{node.url}/v1/effects?after=bogus").status == 400


def test_writes_without_a_session_csrf_or_same_origin_are_refused(
        node: Node, http: urllib3.PoolManager, log: EventLog, workload: Workload) -> None:
    end = log.end_offsets(EVENTS)[0]
    form = {"decision": "retry", "by": "mallory", "reason": "because"}
    no_session = _decide(http, node, workload.payment, form, Origin=node.url)
    assert no_session.status == 403 and b"log in first" in no_session.data
    assert _login(http, node, "wrong")[0] == 403
    cookie, csrf = _session(http, node, workload.payment)
    no_csrf = _decide(http, node, workload.payment, form, Origin=node.url, Cookie=cookie)
    assert no_csrf.status == 403 and b"CSRF" in no_csrf.data
    forged = _decide(http, node, workload.payment, {**form, "csrf": "x" * 43},
                     Origin=node.url, Cookie=cookie)
    assert forged.status == 403
    cross = _decide(http, node, workload.payment, {**form, "csrf": csrf},
                    Origin="http://evil.example", Cookie=cookie)
    assert cross.status == 403 and b"cross-site request refused" in cross.data
    no_origin = _decide(http, node, workload.payment, {**form, "csrf": csrf}, Cookie=cookie)
    assert no_origin.status == 403
    rebinding = http.request("GET", node.url + "/", headers={"Host": "evil.example"})
    assert rebinding.status == 421
    assert log.end_offsets(EVENTS)[0] == end  # nothing was written


def test_a_decision_is_recorded_as_effectlog_approve_records_it(
        node: Node, http: urllib3.PoolManager, log: EventLog, workload: Workload) -> None:
    cookie, csrf = _session(http, node, workload.payment)
    shown = LogView(log).current(workload.payment)
    assert shown is not None
    epoch = str(shown.fencing_epoch)  # what the page's form carries
    assert "HttpOnly" in _login(http, node)[1] and "SameSite=Strict" in _login(http, node)[1]
    empty = _decide(http, node, workload.payment,
                    {"decision": "retry", "by": " ", "reason": "x", "csrf": csrf, "epoch": epoch},
                    Origin=node.url, Cookie=cookie)
    assert empty.status == 400 and b"who decided" in empty.data
    hidden = _decide(http, node, workload.payment,
                     {"decision": "retry", "by": "Dana\u202eOps", "reason": "x", "csrf": csrf,
                      "epoch": epoch},
                     Origin=node.url, Cookie=cookie)
    assert hidden.status == 400 and b"control character" in hidden.data
    assert LogView(log).current(workload.payment).state.value == "UNKNOWN"  # type: ignore[union-attr]
    done = _decide(http, node, workload.payment,
                   {"decision": "retry", "by": "Dana Ops", "reason": "Stripe says no charge",
                    "csrf": csrf, "epoch": epoch}, Referer=_page(node, workload.payment), Cookie=cookie)
    assert done.status == 303
    current = LogView(log).current(workload.payment)
    assert current is not None and current.state.value == "RESERVED"
    assert current.worker_id == "approval:Dana Ops"
    assert current.fencing_epoch == workload.paused.fencing_epoch + 1
    assert current.approval is not None and current.approval.reason == "Stripe says no charge"
    _, page = _get(http, node.url + done.headers["Location"], Cookie=cookie)
    assert "Decision recorded: RETRY by Dana Ops -&gt; RESERVED (epoch 2)" in page
    stale_record(log, workload.paused)
    _, page = _get(http, _page(node, workload.payment))
    assert re.search(r"rejected \((stale_epoch|fenced|illegal_transition)\)", page), page
    again = _decide(http, node, workload.payment,
                    {"decision": "abandon", "by": "Dana Ops", "reason": "twice", "csrf": csrf,
                     "epoch": epoch},
                    Origin=node.url, Cookie=cookie)
    assert again.status == 409 and b"only UNKNOWN or AWAITING_APPROVAL" in again.data


def test_without_a_token_the_console_is_read_only(tmp_path: Path, workload: Workload,
                                                  http: urllib3.PoolManager,
                                                  log: EventLog) -> None:
    node = _node(tmp_path, None, "state-ro")
    try:
        _, page = _get(http, _page(node, workload.payment))
        assert "read-only" in page and 'name="csrf"' not in page and "<form method=\"post\"" \
            not in page
        refused = _decide(http, node, workload.payment,
                          {"decision": "retry", "by": "a", "reason": "b"}, Origin=node.url)
        assert refused.status == 403 and b"read-only" in refused.data
        assert _login(http, node, "")[0] == 403
        current = LogView(log).current(workload.payment)
        assert current is not None and current.state.value == "UNKNOWN"
    finally:
        node.stop()
        node.close()


def test_an_outcome_says_who_recorded_it(node: Node, http: urllib3.PoolManager,
                                         log: EventLog) -> None:
    from effectlog.worker import Worker

    w = Worker(log, "reconciler:host-1:42")
    key = w.create("run-0050-1", "email.send", "mailto:z@example.com", {"n": 1}).idempotency_key
    w.reserve(key)
    w.dispatch(key)
    w.record(key, "succeeded", {"message_id": "m-50"}, source="redispatch")
    deadline, status, page = time.monotonic() + 30, 0, ""
    while status != 200 and time.monotonic() < deadline:
        status, page = _get(http, _page(node, key))
        time.sleep(0.05)
    assert status == 200, page
    assert "SUCCEEDED (reconciler: re-dispatch)" in page  # the summary
    assert "SUCCEEDED (reconciler: re-dispatch): " in page  # the RECORD row
    assert "(redispatch)" not in page and "(worker)" not in page
