"""The web console in a real browser: Debian's Chromium driven by Playwright against a real
`effectlog serve` process on a SQLite log holding a demo-like workload, with named console
users: search, a run's effects, a decision under the logged-in name and what comes next.

Set EFFECTLOG_CONSOLE_SCREENSHOTS=DIR to keep the screenshots of the main pages there
(``make console-screenshots`` refreshes the ones in docs/).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import urllib3

from consumers.console.users import add_user
from consumers.providers.fake import FakeProvider
from effectlog.log import open_log
from effectlog.view import LogView
from effectlog.worker import Worker
from tests.console_support import Workload, fill, stale_record
from tests.kafka_broker import free_port

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]
PASSWORD = "dana's long console password"
WAIT_MS = 15_000
RUN = "job-124"


def _chromium() -> str:
    path = os.environ.get("EFFECTLOG_TEST_CHROMIUM") or shutil.which("chromium") \
        or "/usr/bin/chromium"
    if not Path(path).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium is missing (apt-get install chromium): the browser test "
                        "must run in CI")
        pytest.skip("no Chromium here (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Workload]]:
    """(console URL, log URL, workload): `effectlog serve` with console users and a
    reconciler (whose recovery waits an hour: nothing moves but what the test does)."""
    tmp = tmp_path_factory.mktemp("console")
    log_url = f"sqlite:///{tmp}/log.db"
    log = open_log(log_url)
    try:
        workload = fill(log)
        agent = Worker(log, "agent-1")
        for n, kind, target in ((1, "email.send", "mailto:a@example.com"),
                                (2, "ticket.create", "jira:OPS"),
                                (3, "payment.charge", "stripe:cus_7")):
            agent.create(f"{RUN}.{n}", kind, target, {"n": n})  # effectlog.run's numbering
    finally:
        log.close()
    users = tmp / "console-users"
    add_user(users, "dana", PASSWORD)
    FakeProvider(tmp / "provider.db").close()
    port = free_port()
    err = tmp / "serve.err"
    process = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", log_url, "--state",
         str(tmp / "state"), "serve", "--http", f"127.0.0.1:{port}", "--stuck-after", "1h",
         "--console-users", str(users), "--provider", f"fake:///{tmp / 'provider.db'}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=err.open("w"))
    url = f"http://127.0.0.1:{port}"
    http = urllib3.PoolManager(retries=False, timeout=5)
    deadline = time.monotonic() + 30
    while True:
        try:
            health = http.request("GET", url + "/healthz")
            if health.status == 200 and json.loads(health.data)["partitions"] == {"0": "serving"}:
                break
        except urllib3.exceptions.HTTPError:
            pass
        assert process.poll() is None, err.read_text()
        assert time.monotonic() < deadline, f"serve did not answer: {err.read_text()}"
        time.sleep(0.1)
    try:
        yield url, log_url, workload
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def browser(served: tuple[str, str, Workload]) -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=_chromium())
        yield chromium
        chromium.close()


def _shoot(page: Any, name: str) -> None:
    folder = os.environ.get("EFFECTLOG_CONSOLE_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def test_an_unknown_payment_is_found_and_approved_in_the_browser(
        served: tuple[str, str, Workload], browser: Any) -> None:
    from playwright.sync_api import expect

    url, log_url, workload = served
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(url + "/")
    unknown_tile = page.locator("a.count.state-UNKNOWN b")
    expect(unknown_tile).to_have_text("5")
    expect(page.locator(".lag b")).to_have_text("0")
    _shoot(page, "console-overview")

    page.click("a.count.state-UNKNOWN")
    page.fill("input[name=kind]", "payment.charge")
    page.click("form.filters button[type=submit]")
    rows = page.locator("table.effects tbody tr")
    expect(rows).to_have_count(3)
    _shoot(page, "console-list")
    page.click(f"td.key a:text-is('{workload.payment}')")

    expect(page.locator("h1.key")).to_have_text(workload.payment)
    expect(page.locator("#state")).to_have_text("UNKNOWN")
    timeline = page.locator("#timeline tbody tr")
    expect(timeline).to_have_count(4)
    expect(timeline.nth(3)).to_contain_text("provider timed out after 30s")
    page.click("details.payload summary")
    expect(page.locator("details.payload pre")).to_contain_text('"invoice": "INV-1042"')

    page.click("#login-to-decide")
    page.fill("input[name=name]", "dana")
    page.fill("input[name=password]", PASSWORD)
    page.click(".login button[type=submit]")
    expect(page.locator("h1.key")).to_have_text(workload.payment)
    expect(page.locator("#user")).to_have_text("dana")
    expect(page.locator("#deciding-as")).to_have_text("dana")
    assert page.locator("input[name=by]").count() == 0  # the name is the login's
    page.fill("textarea[name=reason]", "Stripe support: no charge under this key; retry it")
    page.click("button.retry")

    expect(page.locator("#notice")).to_contain_text("Decision recorded: RETRY by dana")
    # the decision asked serve's reconciler: the page, refreshing itself, sees it sent again
    # with the same key and settled (recovery's deadline here is an hour)
    page.evaluate("window.__same_page = true")
    expect(page.locator("#state")).to_have_text("SUCCEEDED", timeout=WAIT_MS)
    expect(timeline).to_have_count(8, timeout=WAIT_MS)
    approve_row = timeline.nth(4)
    for text in ("APPROVE", "RESERVED", "approval:dana", "RETRY by dana: Stripe "
                 "support: no charge under this key; retry it", "accepted"):
        expect(approve_row).to_contain_text(text)
    expect(approve_row.locator("td").nth(4)).to_have_text(str(workload.paused.fencing_epoch + 1))
    expect(timeline.nth(7)).to_contain_text("SUCCEEDED (reconciler: re-dispatch)")

    # live: the paused worker's late record arrives and is refused; the page shows it and
    # the new counts without being reloaded
    log = open_log(log_url)
    try:
        stale_record(log, workload.paused)
        current = LogView(log).current(workload.payment)
    finally:
        log.close()
    assert current is not None and current.state.value == "SUCCEEDED"
    expect(timeline).to_have_count(9, timeout=WAIT_MS)
    expect(timeline.nth(8)).to_contain_text("rejected", timeout=WAIT_MS)
    expect(unknown_tile).to_have_text("4", timeout=WAIT_MS)
    assert page.evaluate("window.__same_page") is True
    page.click("details.payload summary")
    _shoot(page, "console-effect")
    assert errors == []
    context.close()


def test_writes_without_the_token_or_from_another_site_are_refused(
        served: tuple[str, str, Workload], browser: Any) -> None:
    url, log_url, _ = served
    key = "agent:run-0042-4:payment.charge:stripe:cus_BETA7"
    target = f"{url}/effects/{quote(key, safe='')}"
    http = urllib3.PoolManager(retries=False, timeout=10)
    no_token = http.request("POST", target, fields={"decision": "abandon", "by": "x",
                                                    "reason": "y"},
                            encode_multipart=False, headers={"Origin": url})
    assert no_token.status == 403

    context = browser.new_context()
    page = context.new_page()
    page.goto(url + "/login")
    page.fill("input[name=name]", "dana")
    page.fill("input[name=password]", PASSWORD)
    page.click(".login button[type=submit]")
    page.goto(target)
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    attack = (f'<form method="post" action="{target}">'
              f'<input name="csrf" value="{csrf}"><input name="decision" value="abandon">'
              '<input name="by" value="mallory"><input name="reason" value="cross-site">'
              '</form><script>document.forms[0].submit()</script>')
    page.route("http://attacker.test/**", lambda route: route.fulfill(
        status=200, content_type="text/html", body=attack))
    with page.expect_response(target) as answer:
        page.goto("http://attacker.test/")
    assert answer.value.status == 403
    assert "refused" in page.locator("#problem").inner_text()
    log = open_log(log_url)
    try:
        current = LogView(log).current(key)
    finally:
        log.close()
    assert current is not None and current.state.value == "UNKNOWN"
    context.close()


def test_an_on_call_person_finds_effects_by_operation_kind_target_and_run(
        served: tuple[str, str, Workload], browser: Any) -> None:
    from playwright.sync_api import expect

    url, _, _ = served
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url + "/")
    box = page.locator("header form.find input[name=q]")

    box.fill("run-0042")  # part of an operation id: no need for the whole key
    box.press("Enter")
    found = page.locator("#found-key table.effects tbody tr")
    expect(found).to_have_count(3)
    expect(found.first).to_contain_text("payment.charge")

    box = page.locator("header form.find input[name=q]")
    box.fill("cus_BETA")
    box.press("Enter")
    expect(page.locator("#found-target table.effects tbody tr")).to_have_count(1)

    box = page.locator("header form.find input[name=q]")
    box.fill("deploy")
    box.press("Enter")
    expect(page.locator("#found-kind table.effects tbody tr")).to_have_count(1)

    box = page.locator("header form.find input[name=q]")
    box.fill(RUN)
    box.press("Enter")
    expect(page.locator("#found-key table.effects tbody tr")).to_have_count(3)
    page.click(f"#runs a:text-is('{RUN}')")
    rows = page.locator("table.effects.run tbody tr")
    expect(rows).to_have_count(3)
    for n, kind in enumerate(("email.send", "ticket.create", "payment.charge")):
        expect(rows.nth(n).locator("td").first).to_have_text(str(n + 1))
        expect(rows.nth(n)).to_contain_text(kind)
    _shoot(page, "console-run")
    rows.nth(1).locator("td.key a").click()
    expect(page.locator("#run-link")).to_have_text(RUN)
    assert errors == []
    context.close()
