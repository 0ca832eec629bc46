"""``effectlog mcp`` refuses a config it cannot honour at start: one ``error:`` line on stderr
and the documented exit code (2 bad input, 4 the upstream unreachable), before serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.kafka_broker import free_port
from tests.mcp_support import REPO, env, proxy_args, write_config

pytestmark = pytest.mark.timeout(60)

USAGE, UNAVAILABLE = 2, 4


def start(tmp: Path, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *proxy_args(f"sqlite:///{tmp}/log.db", config, *extra)],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=45,
                          stdin=subprocess.DEVNULL)


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    return errors[0]


@pytest.mark.parametrize(("effects", "says"), [
    ('[effects.refund]\nkind = "payment.refund"\ntarget = "customer:{customer}"\n',
     "the upstream has no tool 'refund'"),
    ('[effects.charge]\nkind = "payment.charge"\ntarget = "customer:{client}"\n',
     "target names argument(s) client"),
    ('[effects.charge]\nkind = "payment.charge"\ntarget = "customer:{customer"\n',
     "bad target template"),
])
def test_a_config_the_upstream_cannot_honour_is_refused_at_start(
        tmp_path: Path, effects: str, says: str) -> None:
    done = start(tmp_path, write_config(tmp_path, tmp_path / "up.db", effects=effects))
    assert done.returncode == USAGE
    assert says in one_error(done)
    assert not (tmp_path / "log.db").exists()  # refused before the log is made


def test_an_unreachable_upstream_is_exit_4_and_makes_no_log(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    done = start(tmp_path, write_config(tmp_path, tmp_path / "up.db", url=url))
    assert done.returncode == UNAVAILABLE
    assert "cannot reach the upstream MCP server" in one_error(done)
    assert not (tmp_path / "log.db").exists()


def test_no_upstream_and_bad_options_are_exit_2(tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text('[effects.charge]\nkind = "payment.charge"\ntarget = "c:{customer}"\n')
    assert "no upstream" in one_error(done := start(tmp_path, bare))
    assert done.returncode == USAGE
    config = write_config(tmp_path, tmp_path / "up.db")
    done = start(tmp_path, config, "--run-id", "no spaces")
    assert done.returncode == USAGE and "invalid run id" in one_error(done)
    done = start(tmp_path, tmp_path / "missing.toml")
    assert done.returncode == USAGE and "no config file" in one_error(done)
