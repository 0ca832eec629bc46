"""Bad input gets one clear line and its documented exit code, never ``internal error``; nothing
already written is lost, and nothing is created by a failed command (docs/reference/cli.md).

Each CLI test runs the installed ``effectlog`` script against a SQLite log in a temporary
directory, as tests/unit/test_exit_codes.py does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3

from consumers.providers.http import HttpProvider
from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable, CodecError, InvalidInput
from effectlog.keys import MAX_FENCING_EPOCH, canonical_payload, make_key, payload_hash
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.log.kafka.settings import KafkaSettings
from effectlog.model import State, Transition
from effectlog.provider import LookupStatus
from effectlog.worker import Worker
from projections.paging import parse_cursor
from tests.recovery_support import Harness, stuck

pytestmark = pytest.mark.timeout(120)

EFFECTLOG = Path(sys.executable).with_name("effectlog")
OK, USAGE, UNAVAILABLE = 0, 2, 4
KIND, TARGET = "email.send", "mailto:a@example.com"
KEY = make_key("op-1", KIND, TARGET)


def run(tmp: Path, *args: str, stdin: str = "",
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EFFECTLOG), "--log", f"sqlite:///{tmp}/log.db", "--state",
                           str(tmp / "state"), *args], input=stdin, capture_output=True,
                          text=True, cwd=tmp, timeout=60, env={**os.environ, **(env or {})})


def expect(done: subprocess.CompletedProcess[str], code: int, message: str) -> str:
    """The exit code and exactly one ``error:`` line holding ``message``; that line."""
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], done.stderr
    return errors[0]


def line(transition: str, **fields: object) -> str:
    return json.dumps({"operation_id": "op-1", "kind": KIND, "target": TARGET,
                       "worker_id": "w1", "transition": transition, **fields}) + "\n"


CREATE = line("create", payload={"n": 1})


def events(tmp: Path) -> int:
    done = run(tmp, "history", KEY, "--json")
    return len(done.stdout.splitlines())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- 1: the maximum fencing epoch -----------------------------------------------------------

@pytest.mark.parametrize("epoch", [MAX_FENCING_EPOCH + 1, 2**63 - 1, 2**63, 10**23])
def test_append_refuses_an_epoch_above_the_maximum_and_keeps_the_lines_before(
        tmp_path: Path, epoch: int) -> None:
    done = run(tmp_path, "append", stdin=CREATE + line("reserve", fencing_epoch=epoch))
    expect(done, USAGE, f"line 2: fencing_epoch must be an integer from 0 to {2**53 - 1}")
    assert len(done.stdout.splitlines()) == 1 and events(tmp_path) == 1


def test_append_takes_the_maximum_epoch_itself(tmp_path: Path) -> None:
    done = run(tmp_path, "append", stdin=CREATE + line("reserve", fencing_epoch=MAX_FENCING_EPOCH))
    assert done.returncode == OK, done.stderr
    assert json.loads(done.stdout.splitlines()[1])["fencing_epoch"] == 2**53 - 1


def test_an_epoch_beyond_64_bits_is_a_codec_error_naming_the_field() -> None:
    event = Worker(open_log("memory://"), "w1").create("op-1", KIND, TARGET, {})
    record = {**event.to_record(), "fencing_epoch": 2**63}
    with pytest.raises(CodecError, match="fencing_epoch out of the 64-bit range"):
        event_codec().encode(record)


def test_the_worker_api_refuses_an_epoch_beyond_64_bits_as_invalid_input() -> None:
    log = open_log("memory://")
    worker = Worker(log, "w1")
    key = worker.create("op-1", KIND, TARGET, {}).idempotency_key
    with pytest.raises(InvalidInput, match="fencing_epoch"):
        worker.reserve(key, epoch=2**63)
    assert [e.transition.value for e in worker.history(key)] == ["CREATE"]


def test_a_huge_epoch_on_the_log_is_rejected_and_does_not_stop_the_reconciler(
        tmp_path: Path) -> None:
    """The rules refuse an epoch above the maximum, so a record written with one (before the
    bound, or by another tool) never becomes a key's state, and no claim past it is made."""
    harness = Harness(tmp_path, f"sqlite:///{tmp_path}/log.db")
    created = harness.worker.create("op-huge", KIND, TARGET, {})
    with pytest.raises(InvalidInput, match="fencing_epoch must be"):
        harness.worker.reserve(created.idempotency_key, epoch=2**63 - 1)
    huge = created.next(Transition.RESERVE, State.RESERVED, fencing_epoch=2**63 - 1,
                        worker_id="w1")  # by another tool
    harness.log.append(EVENTS, huge.idempotency_key, event_codec().encode(huge.to_record()))
    other = stuck(harness.worker, "op-other", State.RESERVED)
    handled = {h.key: h for h in harness.recover_and_reconcile()}
    assert handled[other].state is State.SUCCEEDED
    assert harness.worker.get(huge.idempotency_key).state is State.CREATED  # type: ignore[union-attr]


# -- 2: internal errors that are bad input or an outage ------------------------------------

def test_a_payload_with_a_lone_surrogate_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"lone surrogate \\ud800"):
        canonical_payload({"\ud800": 1})
    expect(run(tmp_path, "append", stdin=line("create", payload={"\ud800": 1})), USAGE,
           r"line 1: payload is not valid Unicode: lone surrogate \ud800")
    done = run(tmp_path, "append", stdin=CREATE + line("reserve", payload={"x": "\udfff"}))
    expect(done, USAGE, "line 2: payload is not valid Unicode")
    assert events(tmp_path) == 1


def test_reconcile_and_serve_with_an_unreachable_http_provider_exit_4(tmp_path: Path) -> None:
    assert run(tmp_path, "append", stdin=CREATE).returncode == OK
    provider = f"http://127.0.0.1:{free_port()}"
    expect(run(tmp_path, "reconcile", "--once", "--provider", provider), UNAVAILABLE,
           f"provider unreachable: cannot reach {provider.removeprefix('http://')}")
    expect(run(tmp_path, "serve", "--provider", provider, "--metrics-port", str(free_port())),
           UNAVAILABLE, "provider unreachable")


def test_a_provider_factory_that_cannot_reach_its_system_exits_4(tmp_path: Path) -> None:
    (tmp_path / "down_provider.py").write_text(
        "from effectlog.provider import ProviderUnavailable\n\n"
        "def make():\n    raise ProviderUnavailable('gateway down')\n")
    assert run(tmp_path, "append", stdin=CREATE).returncode == OK
    expect(run(tmp_path, "reconcile", "--once", "--provider", "down_provider:make",
               env={"PYTHONPATH": str(tmp_path)}), UNAVAILABLE,
           "provider down_provider:make unreachable: gateway down")


def test_an_unreachable_http_provider_is_still_unavailable_to_the_reconciler() -> None:
    """At work (not at start) the adapter answers as before: lookups UNAVAILABLE."""
    provider = HttpProvider(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    assert provider.lookup(KEY).status is LookupStatus.UNAVAILABLE
    with pytest.raises(BackendUnavailable, match="provider unreachable"):
        HttpProvider.from_url(f"http://127.0.0.1:{free_port()}")


@pytest.mark.parametrize("query", ["timeout_s=abc", "retention_s=abc", "timeout_s=0",
                                   "retention_s=-1", "timeout_s=nan"])
def test_bad_numbers_in_an_http_provider_url_are_bad_input(tmp_path: Path, query: str) -> None:
    name = query.split("=")[0]
    assert run(tmp_path, "append", stdin=CREATE).returncode == OK
    expect(run(tmp_path, "reconcile", "--once", "--provider",
               f"http://127.0.0.1:{free_port()}?lookup_complete=1&{query}"), USAGE, name)


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_fake_provider_serve_refuses_a_port_out_of_range_and_creates_nothing(
        tmp_path: Path, port: str) -> None:
    expect(run(tmp_path, "fake-provider", "serve", "--port", port, "--db", "f.db"), USAGE,
           "--port")
    assert list(tmp_path.iterdir()) == []


def test_fake_provider_serve_on_a_taken_port_exits_4_and_leaves_no_database(
        tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(tmp_path, "fake-provider", "serve", "--port", str(port), "--db", "f.db")
    expect(done, UNAVAILABLE, f"cannot serve on 127.0.0.1:{port}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cursor", ["99999999999999999999999:agent%3Aa", "\u00b2:agent%3Aa",
                                    "5:agent%FF"])
def test_list_refuses_a_cursor_it_cannot_use(tmp_path: Path, cursor: str) -> None:
    with pytest.raises(InvalidInput, match="cursor"):
        parse_cursor(cursor)
    assert run(tmp_path, "append", stdin=CREATE).returncode == OK
    assert run(tmp_path, "project", "--once").returncode == OK
    expect(run(tmp_path, "list", "--after", cursor), USAGE, "cursor")


# -- 3: append drops nothing silently -------------------------------------------------------

@pytest.mark.parametrize(("bad", "message"), [
    (line("create", paylod={"n": 1}), "line 1: unknown field 'paylod'"),
    (line("create"), "line 1: create needs 'payload'"),
    (line("create", payload={}, fencing_epoch=3), "line 1: 'fencing_epoch' is not taken by create"),
    (line("create", payload={}, worker_id=""), "line 1: worker_id must not be empty"),
    (line("create", payload={}, worker_id="w\x01"), "line 1: worker_id contains the control"),
    (line("create", payload={}, outcome={"status": "succeeded"}), "line 1: 'outcome' is not taken"),
    (line("create", payload_ref=""), "line 1: 'payload_ref' must be a non-empty string"),
])
def test_append_refuses_a_line_it_would_partly_ignore(tmp_path: Path, bad: str,
                                                      message: str) -> None:
    expect(run(tmp_path, "append", stdin=bad), USAGE, message)
    assert not (tmp_path / "log.db").exists()  # a refused first line creates no log


def test_a_create_with_an_explicit_null_payload_is_taken_as_the_python_api_takes_it(
        tmp_path: Path) -> None:
    done = run(tmp_path, "append", stdin=line("create", payload=None))
    assert done.returncode == OK, done.stderr
    [row] = [json.loads(x) for x in run(tmp_path, "history", KEY, "--json").stdout.splitlines()]
    assert row["event"]["payload_hash"] == payload_hash(None)  # Worker.create(..., None)'s


@pytest.mark.parametrize(("bad", "message"), [
    (line("record"), "line 2: record needs outcome.status succeeded|failed"),
    (line("record", outcome={"status": "succeeded", "reslt": 1}),
     "line 2: unknown field 'outcome.reslt'"),
    (line("reserve", worker_id="w\x1b"), "line 2: worker_id contains the control character"),
    (line("reserve", worker_id="   "), "line 2: worker_id must not be empty"),
    (line("reserve", outcome={"status": "failed"}), "line 2: 'outcome' is not taken by reserve"),
])
def test_a_bad_later_line_is_named_once_and_the_lines_before_stay(tmp_path: Path, bad: str,
                                                                  message: str) -> None:
    done = run(tmp_path, "append", stdin=CREATE + bad)
    error = expect(done, USAGE, message)
    assert error.count("line ") == 1, error
    assert len(done.stdout.splitlines()) == 1 and events(tmp_path) == 1


# -- 4, 5: paths the fake provider and replay --out cannot use ------------------------------

@pytest.mark.parametrize("spec", ["fake://", "fake://?dedupe=0", "fake:///{tmp}/no/dir/p.db",
                                  "fake:///{tmp}"])
def test_a_fake_provider_path_that_cannot_be_used_is_bad_input(tmp_path: Path,
                                                               spec: str) -> None:
    assert run(tmp_path, "append", stdin=CREATE).returncode == OK
    expect(run(tmp_path, "reconcile", "--once", "--provider", spec.format(tmp=tmp_path)),
           USAGE, "fake provider URL")
    assert not (tmp_path / "no").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.db"]


@pytest.mark.parametrize(("out", "message"), [
    ("", "an empty file name"), ("{tmp}/no/dir/x.jsonl", "{tmp}/no/dir does not exist"),
    ("{tmp}/log.db/x.jsonl", "{tmp}/log.db is not a directory")])
@pytest.mark.parametrize("command", [("replay", "--out"),
                                     ("expire", "--older-than", "1s", "--archive")])
def test_an_output_file_that_cannot_be_written_is_bad_input_naming_it(
        tmp_path: Path, out: str, message: str, command: tuple[str, ...]) -> None:
    assert run(tmp_path, "append", stdin=CREATE).returncode == OK
    expect(run(tmp_path, *command, out.format(tmp=tmp_path)), USAGE,
           message.format(tmp=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.db"]


# -- 6: a malformed key over HTTP is 400 ----------------------------------------------------

def test_the_query_api_answers_400_for_a_malformed_key(tmp_path: Path) -> None:
    from consumers.node.node import Node, NodeSettings

    log_url = f"sqlite:///{tmp_path}/log.db"
    open_log(log_url).close()
    node = Node(log_url, NodeSettings(state_dir=tmp_path / "state", http_port=0)).start()
    try:
        http = urllib3.PoolManager(retries=False, timeout=30)
        bad = http.request("GET", f"{node.url}/v1/effects/badkey")
        assert bad.status == 400 and "invalid idempotency key" in json.loads(bad.data)["error"]
        unknown = http.request("GET", f"{node.url}/v1/effects/agent:nope:x:y?fresh=1")
        assert unknown.status == 404
    finally:
        assert node.stop() == []
        node.close()


# -- 7, 8: Kafka URLs and messages ----------------------------------------------------------

@pytest.mark.parametrize("url", ["kafka://:99999", "kafka://h:99999", "kafka://:9092",
                                 "kafka://h:0", "kafka://h:9092,", "kafka://h:abc"])
def test_a_kafka_url_with_a_bad_broker_address_is_bad_input(tmp_path: Path, url: str) -> None:
    with pytest.raises(InvalidInput, match="port from 1 to 65535"):
        KafkaSettings.from_url(url)
    done = subprocess.run([str(EFFECTLOG), "--log", url, "--state", str(tmp_path / "s"), "stats"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    expect(done, USAGE, "is not host:port")


def test_good_kafka_broker_lists_still_parse() -> None:
    for url in ("kafka://h:9092", "kafka://h", "kafka://h1:9092,h2:9093", "kafka://[::1]:9092",
                "kafka://u:p@h:9092?prefix=x"):
        assert KafkaSettings.from_url(url).bootstrap


def test_topics_delete_against_a_dead_broker_says_so_in_plain_words(tmp_path: Path) -> None:
    done = subprocess.run([str(EFFECTLOG), "--log", f"kafka://127.0.0.1:{free_port()}",
                           "--timeout", "1", "topics", "delete", "--prefix", "x", "--yes"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    error = expect(done, UNAVAILABLE, "unreachable: ")
    assert "KafkaError{" not in error, error
