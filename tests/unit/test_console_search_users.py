"""The console for an on-call person: one search box (key, operation, run, kind, target), a
run's effects together, named logins from a users file with decisions recorded under the
logged-in name, and what happens next after a decision."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import urllib3

from consumers.console import ConsoleSettings, console_routes
from consumers.console.pages import next_step
from consumers.console.users import Users, add_user
from consumers.node.node import Node, NodeSettings
from consumers.recovery import RecoverySettings
from effectlog.errors import InvalidInput
from effectlog.log import open_log
from effectlog.log.base import EventLog
from effectlog.view import LogView
from effectlog.worker import Worker
from tests.console_support import Workload, fill

pytestmark = pytest.mark.timeout(120)
PASSWORD = "ada's long password"
RUN = "job-124"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    handle = open_log(f"sqlite:///{tmp_path}/log.db")
    yield handle
    handle.close()


@pytest.fixture
def workload(log: EventLog) -> Workload:
    """The console workload plus a run of effectlog.run's numbering, created out of order."""
    found = fill(log)
    worker = Worker(log, "agent-1")
    for n, kind, target in ((2, "ticket.create", "jira:OPS"), (1, "email.send", "mailto:a@x.org"),
                            (3, "payment.charge", "stripe:cus_7")):
        worker.create(f"{RUN}.{n}", kind, target, {"n": n})
    return found


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "console-users"
    add_user(path, "ada", PASSWORD)
    add_user(path, "grace", "grace's long password")
    return path


def _node(tmp_path: Path, settings: ConsoleSettings) -> Node:
    node = Node(f"sqlite:///{tmp_path}/log.db", NodeSettings(state_dir=tmp_path / "state",
                                                              http_port=0),
                extra_routes=console_routes(settings)).start()
    deadline = time.monotonic() + 30
    while node.gate.serving() != [0]:
        assert time.monotonic() < deadline, "the node did not start serving"
        time.sleep(0.02)
    return node


@pytest.fixture
def node(tmp_path: Path, workload: Workload, users_file: Path) -> Iterator[Node]:
    running = _node(tmp_path, ConsoleSettings(users=Users.load(users_file), reconciles=True,
                                              recovery=RecoverySettings(stuck_after_s=120)))
    yield running
    assert running.stop() == []
    running.close()


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager(retries=False, timeout=10)


def _get(http: urllib3.PoolManager, url: str, **headers: str) -> tuple[int, str]:
    answer = http.request("GET", url, headers=headers, redirect=False)
    return answer.status, answer.data.decode("utf-8")


def _keys(page: str, section: str) -> list[str]:
    part = page.split(f'id="found-{section}"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'<td class="key"><a href="[^"]+">([^<]+)</a>', part)


def test_one_box_finds_by_key_prefix_operation_kind_and_target(
        node: Node, http: urllib3.PoolManager, workload: Workload) -> None:
    _, page = _get(http, f"{node.url}/search?q=run-0042")  # an operation id's prefix
    assert sorted(_keys(page, "key")) == sorted(
        f"agent:run-0042-{n}:payment.charge:stripe:{c}"
        for n, c in ((3, "cus_ACME42"), (4, "cus_BETA7"), (5, "cus_GAMMA3")))
    _, page = _get(http, f"{node.url}/search?q=payment.ch")
    assert len(_keys(page, "kind")) == 4 and _keys(page, "key") == []
    _, page = _get(http, f"{node.url}/search?q=cus_BETA")
    assert _keys(page, "target") == ["agent:run-0042-4:payment.charge:stripe:cus_BETA7"]
    status, _ = _get(http, f"{node.url}/search?q={quote(workload.payment)}")
    assert status == 303  # a whole key that exists opens its page
    _, page = _get(http, f"{node.url}/search?q={RUN}")
    assert f'href="/runs/{RUN}"' in page and len(_keys(page, "key")) == 3
    _, page = _get(http, f"{node.url}/search?q=nothing-like-this")
    assert page.count('<p class="empty">None.</p>') == 3
    assert _get(http, f"{node.url}/search?q=%01")[0] == 400


def test_a_run_shows_its_effects_together_in_call_order(node: Node,
                                                        http: urllib3.PoolManager) -> None:
    status, page = _get(http, f"{node.url}/runs/{RUN}")
    assert status == 200
    keys = re.findall(r'<td class="key"><a href="[^"]+">([^<]+)</a>', page)
    assert keys == [f"agent:{RUN}.1:email.send:mailto:a@x.org",
                    f"agent:{RUN}.2:ticket.create:jira:OPS",
                    f"agent:{RUN}.3:payment.charge:stripe:cus_7"]
    _, effect = _get(http, f"{node.url}/effects/{quote(keys[1], safe='')}")
    assert f'<a id="run-link" href="/runs/{RUN}">{RUN}</a>' in effect
    _, empty = _get(http, f"{node.url}/runs/no-such-run")
    assert "No effect of this run" in empty
    _, listed = _get(http, f"{node.url}/effects?state=CREATED&key=agent:{RUN}.")
    assert len(re.findall(r'<td class="key">', listed)) == 3


def _login(http: urllib3.PoolManager, node: Node, name: str, password: str) -> str | None:
    answer = http.request("POST", f"{node.url}/login", redirect=False,
                          fields={"name": name, "password": password, "next": "/"},
                          encode_multipart=False, headers={"Origin": node.url})
    return answer.headers.get("Set-Cookie", "").split(";", 1)[0] if answer.status == 303 else None


def test_a_decision_is_recorded_under_the_logged_in_name_and_says_what_comes_next(
        node: Node, http: urllib3.PoolManager, log: EventLog, workload: Workload) -> None:
    assert _login(http, node, "ada", "wrong password!") is None
    assert _login(http, node, "mallory", PASSWORD) is None
    cookie = _login(http, node, "ada", PASSWORD)
    assert cookie is not None
    page_url = f"{node.url}/effects/{quote(workload.payment, safe='')}"
    _, page = _get(http, page_url, Cookie=cookie)
    assert '<b id="deciding-as">ada</b>' in page and 'name="by"' not in page
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    epoch = re.search(r'name="epoch" value="(\d+)"', page).group(1)  # type: ignore[union-attr]
    fields = {"decision": "retry", "by": "somebody else", "csrf": csrf, "epoch": epoch,
              "reason": "Stripe: no charge under this key"}
    done = http.request("POST", page_url, redirect=False, encode_multipart=False,
                        fields=fields, headers={"Origin": node.url, "Cookie": cookie})
    assert done.status == 303
    current = LogView(log).current(workload.payment)
    assert current is not None and current.approval is not None
    assert current.approval.by == "ada" and current.worker_id == "approval:ada"
    _, after = _get(http, node.url + done.headers["Location"], Cookie=cookie)
    assert "Decision recorded: RETRY by ada" in after
    found = re.search(r'<p class="banner next" id="next">([^<]+)</p>', after)
    assert found is not None and "Next: the reconciler of its partition sends it again" \
        in found.group(1), after
    assert "recovery takes it up at" in found.group(1)
    assert "120s after the decision" in found.group(1) and "epoch 2" in found.group(1)


def test_a_decision_form_is_about_the_state_its_page_showed(
        node: Node, http: urllib3.PoolManager, log: EventLog, workload: Workload) -> None:
    cookie = _login(http, node, "ada", PASSWORD)
    assert cookie is not None
    page_url = f"{node.url}/effects/{quote(workload.payment, safe='')}"
    _, page = _get(http, page_url, Cookie=cookie)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    before = LogView(log).current(workload.payment)
    assert before is not None
    for epoch, status, says in (("", 400, "reload the page"),
                                (str(before.fencing_epoch + 5), 409, "moved on since")):
        sent = http.request("POST", page_url, redirect=False, encode_multipart=False,
                            fields={"decision": "abandon", "csrf": csrf, "epoch": epoch,
                                    "reason": "a stale form"},
                            headers={"Origin": node.url, "Cookie": cookie})
        assert sent.status == status and says in sent.data.decode("utf-8")
    assert LogView(log).current(workload.payment) == before  # nothing written


def test_next_steps_name_who_sends_a_retry_and_when() -> None:
    retried = {"state": "RESERVED", "approval": {"decision": "RETRY", "by": "ada"},
               "occurred_at": 1_000_000, "kind": "payment.charge", "fencing_epoch": 3}
    alone = next_step(retried, reconciles=False, deadline_s=300, poll_s=5, now_ms=1_000_000)
    assert alone is not None and "started with --no-recovery" in alone
    soon = next_step(retried, reconciles=True, deadline_s=300, poll_s=5, now_ms=1_060_000)
    assert soon is not None and "sends it again with the same key at epoch 3 within seconds" \
        in soon
    assert "(in 4m 00s)" in soon and "within 5s" in soon
    abandoned = next_step({**retried, "state": "ABANDONED"}, reconciles=True, deadline_s=300,
                          poll_s=5, now_ms=0)
    assert abandoned == "Done: abandoned by ada; nothing will be sent."
    assert next_step({**retried, "state": "SUCCEEDED"}, reconciles=True, deadline_s=1,
                     poll_s=1, now_ms=0) is None


def test_console_users_add_keeps_only_a_hash_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "users"

    def add(name: str, password: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "console-users", "add",
                               name, "--file", str(path), "--password-stdin"],
                              input=password + "\n", capture_output=True, text=True, timeout=60)

    assert add("ada", PASSWORD).stdout == f"added ada in {path}\n"
    assert add("ada", "a newer long password").stdout == f"updated ada in {path}\n"
    assert add("bob", "short").returncode == 2
    assert add("bad:name", PASSWORD).returncode == 2
    text = path.read_text()
    assert "long password" not in text and text.count("\n") == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    users = Users.load(path)
    assert users.check("ada", "a newer long password") == "ada"
    assert users.check("ada", PASSWORD) is None
    path.write_text("ada:plain:text\n")
    with pytest.raises(InvalidInput, match="expected name:scrypt"):
        Users.load(path)
    notes = tmp_path / "notes.txt"  # --file pointing at something else: refused, kept as is
    notes.write_text("my notes\nimportant\n")
    path = notes
    refused = add("erin", PASSWORD)
    assert refused.returncode == 2 and "notes.txt:1: expected name:scrypt" in refused.stderr
    assert notes.read_text() == "my notes\nimportant\n"


def test_serve_refuses_a_users_file_that_does_not_parse_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "users"
    bad.write_text("dana:hunter2\n")
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           f"sqlite:///{tmp_path}/log.db", "--state", str(tmp_path / "state"),
                           "serve", "--http", "127.0.0.1:0", "--console-users", str(bad),
                           "--no-recovery"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "expected name:scrypt" in done.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "log.db").exists()
