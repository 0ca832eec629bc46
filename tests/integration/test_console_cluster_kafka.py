"""The web console of a cluster on Apache Kafka: two `effectlog serve` processes over six
partitions; either one pages through the whole group's list, shows the timeline of a key
the other owns, and records a decision on it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from effectlog.codec import event_codec
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.log.kafka.partitioner import murmur2_partition
from effectlog.machine import advance, new_effect
from effectlog.model import Transition as T
from tests.cluster_support import HTTP, Serve, answer, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
TOKEN = "cluster-console-token"


def _unknown_effects(log_url: str, count: int) -> list[str]:
    """``count`` effects left UNKNOWN, spread over the partitions; keys in index order."""
    codec = event_codec()
    log = open_log(log_url)
    keys = []
    try:
        for i in range(count):
            kind = "payment.charge" if i % 3 == 0 else "email.send"
            create = new_effect(f"op{i}", kind, f"acct:{i}", {"n": i}, "w1")
            reserve = advance(create, T.RESERVE, "w1")
            dispatch = advance(reserve, T.DISPATCH, "w1")
            unknown = advance(dispatch, T.UNKNOWN, "w1", error="timed out")
            log.append_many(EVENTS, [(create.idempotency_key, codec.encode(e.to_record()))
                                     for e in (create, reserve, dispatch, unknown)])
            keys.append(create.idempotency_key)
            time.sleep(0.002)  # distinct last-transition times: the list's order is known
    finally:
        log.close()
    return keys


def _page(url: str, within_s: float = 30.0) -> str:
    """The console page at ``url``. A 503 (a partition moving between the members, as a
    loaded machine's missed heartbeat can still make them do after they first settled) is
    asked again, as its ``Retry-After`` says, for up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        response = HTTP.request("GET", url)
        if response.status == 200:
            return str(response.data.decode("utf-8"))
        text = " ".join(re.sub(r"<[^>]+>", " ", response.data.decode("utf-8")).split())
        assert response.status == 503 and time.monotonic() < deadline, \
            f"{url}: HTTP {response.status}: {text[-400:]}"
        time.sleep(0.5)


def _keys_on(page: str) -> list[str]:
    return re.findall(r'<td class="key"><a href="[^"]+">([^<]+)</a>', page)


def test_either_member_serves_the_whole_console(kafka_url: str, tmp_path: Path) -> None:
    keys = _unknown_effects(kafka_url, 30)
    members = [Serve(tmp_path, f"s{i}", kafka_url, None, None, "--console-token", TOKEN)
               for i in range(2)]
    try:
        wait_until(lambda: sorted(p for m in members for p in m.serving()) == list(range(6))
                   and all(m.serving() for m in members), 90, "two members share six partitions")
        first, second = members
        seen: list[str] = []
        url: str | None = f"{first.url}/effects?state=UNKNOWN&limit=7"
        for _ in range(10):
            assert url is not None
            page = _page(url)
            seen += _keys_on(page)
            found = re.search(r'<a class="next" href="([^"]+)"', page)
            url = None if found is None else first.url + found.group(1).replace("&amp;", "&")
            if url is None:
                break
        assert seen == keys  # every key once, in the group's index order
        payments = _keys_on(_page(f"{second.url}/effects?state=UNKNOWN&kind=payment&limit=50"))
        assert payments == keys[::3]

        theirs = set(second.serving())
        elsewhere = next(k for k in keys[::3]
                         if murmur2_partition(k.encode("utf-8"), 6) in theirs)
        key_page = f"{first.url}/effects/{quote(elsewhere, safe='')}"
        page = _page(key_page)
        assert 'id="state">UNKNOWN<' in page and page.count("<td>DISPATCH</td>") == 1
        assert "timed out" in page and "payment.charge" in page

        login = HTTP.request("POST", f"{first.url}/login", fields={"token": TOKEN},
                             encode_multipart=False, headers={"Origin": first.url},
                             redirect=False)
        assert login.status == 303
        cookie = login.headers["Set-Cookie"].split(";", 1)[0]
        form = HTTP.request("GET", key_page, headers={"Cookie": cookie}).data.decode("utf-8")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        epoch = re.search(r'name="epoch" value="(\d+)"', form)
        assert csrf is not None and epoch is not None
        decided = HTTP.request("POST", key_page, encode_multipart=False, redirect=False,
                               fields={"decision": "abandon", "by": "Ravi", "csrf": csrf.group(1),
                                       "epoch": epoch.group(1),
                                       "reason": "customer cancelled the order"},
                               headers={"Origin": first.url, "Cookie": cookie})
        assert decided.status == 303, decided.data[:500]
        status, body = answer(f"{second.url}/v1/effects/{quote(elsewhere, safe='')}?fresh=1")
        assert status == 200 and body["state"] == "ABANDONED"
        assert body["approval"]["by"] == "Ravi" and body["worker_id"] == "approval:Ravi"
        again = HTTP.request("GET", key_page).data.decode("utf-8")
        assert "ABANDON by Ravi: customer cancelled the order" in again
    finally:
        for member in members:
            member.stop()
