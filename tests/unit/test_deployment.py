"""docker-compose.yml, Dockerfile and .dockerignore, checked without a Docker engine."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
METRICS_PORT = 9464


def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def service(name: str) -> dict[str, Any]:
    services = compose()["services"]
    assert name in services, f"no service {name!r}"
    return dict(services[name])


def env(name: str) -> dict[str, str]:
    raw = service(name).get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: str(v) for k, v in raw.items()}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines()
             if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def instructions(name: str) -> list[str]:
    return [args for word, args in dockerfile() if word == name]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- docker-compose.yml ------------------------------------------------------------------------

def test_compose_has_kafka_topics_and_effectlog_services() -> None:
    assert {"kafka", "topics", "effectlog"} <= set(compose()["services"])


def test_kafka_is_the_official_image_in_single_node_kraft_mode() -> None:
    kafka, settings = service("kafka"), env("kafka")
    assert kafka["image"].startswith("apache/kafka:")
    assert set(settings["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = settings["KAFKA_NODE_ID"]
    voters = settings["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == 1 and voters[0].startswith(f"{node}@kafka:")
    controller = settings["KAFKA_CONTROLLER_LISTENER_NAMES"]
    listeners = dict(item.split("://") for item in settings["KAFKA_LISTENERS"].split(","))
    assert f":{voters[0].rsplit(':', 1)[1]}" == listeners[controller]
    protocol_map = dict(item.split(":")
                        for item in settings["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocol_map)
    advertised = settings["KAFKA_ADVERTISED_LISTENERS"]
    assert "kafka:9092" in advertised and controller not in advertised
    for name in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                 "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
        assert settings[name] == "1"
    assert settings["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_kafka_has_a_health_check_with_the_images_own_tools() -> None:
    check = service("kafka")["healthcheck"]
    test = " ".join(check["test"]) if isinstance(check["test"], list) else check["test"]
    assert re.search(r"/opt/kafka/bin/kafka-(broker-api-versions|topics)\.sh", test)
    assert "--bootstrap-server" in test
    assert int(check["retries"]) >= 3 and check["interval"] and check["start_period"]


def test_kafka_data_and_effectlog_state_live_on_named_volumes() -> None:
    volumes = compose()["volumes"]
    kafka_mounts = dict(v.split(":", 1) for v in service("kafka")["volumes"])
    assert kafka_mounts[next(iter(kafka_mounts))] == env("kafka")["KAFKA_LOG_DIRS"]
    mounts = dict(v.split(":", 1) for v in service("effectlog")["volumes"])
    assert set(mounts) | set(kafka_mounts) <= set(volumes)
    state = env("effectlog")["EFFECTLOG_STATE"]
    assert any(state == target or state.startswith(target.rstrip("/") + "/")
               for target in mounts.values())


def test_topics_is_a_one_shot_that_waits_for_a_healthy_broker() -> None:
    topics = service("topics")
    assert topics["command"] == ["topics", "create"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert topics.get("restart", "no") == "no"
    assert topics["healthcheck"].get("disable") is True


def test_serve_starts_after_topics_were_created() -> None:
    serve = service("effectlog")
    assert serve["command"][0] == "serve"
    assert serve["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert serve["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert any(str(p).endswith(f":{METRICS_PORT}") for p in serve["ports"])
    assert any(str(p).startswith("127.0.0.1:") for p in serve["ports"])
    # serve binds 127.0.0.1 by default: inside a container the published port needs 0.0.0.0.
    command = serve["command"]
    assert command[command.index("--metrics-host") + 1] == "0.0.0.0"
    assert command[command.index("--metrics-port") + 1] == str(METRICS_PORT)
    assert ("--provider" in command) != ("--no-recovery" in command)  # serve refuses neither


def test_the_images_default_serve_says_whether_it_recovers() -> None:
    (cmd,) = instructions("CMD")
    assert ("--provider" in cmd) != ("--no-recovery" in cmd), cmd


def test_effectlog_services_share_one_kafka_url_the_code_accepts() -> None:
    url = env("effectlog")["EFFECTLOG_LOG"]
    assert url == "kafka://kafka:9092?prefix=effects"
    assert env("topics")["EFFECTLOG_LOG"] == url
    for name in ("topics", "effectlog"):
        build = service(name)["build"]
        assert build["context"] == "." and (ROOT / build["dockerfile"]).is_file()
    pytest.importorskip("confluent_kafka")
    from effectlog.log.kafka import KafkaSettings

    settings = KafkaSettings.from_url(url)
    assert (settings.bootstrap, settings.prefix) == ("kafka:9092", "effects")


def test_published_ports_bind_to_localhost_only() -> None:
    for name, spec in compose()["services"].items():
        for port in spec.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


# -- Dockerfile ----------------------------------------------------------------------------------

def test_dockerfile_builds_on_python_slim() -> None:
    assert instructions("FROM") == ["python:3.11-slim"]


def test_dockerfile_installs_the_package_from_pyproject() -> None:
    copied = [shlex.split(args)[:-1] for args in instructions("COPY")]
    sources = {src.rstrip("/") for srcs in copied for src in srcs if not src.startswith("--")}
    assert {"pyproject.toml", "README.md", "schemas"} <= sources
    packages = pyproject()["tool"]["setuptools"]["packages"]
    top_level = {p.split(".")[0] for p in packages}
    assert top_level == {"effectlog", "projections", "consumers"}
    assert top_level <= sources
    for src in sources:
        assert (ROOT / src).exists(), src
    runs = " ".join(instructions("RUN"))
    assert re.search(r"pip install (--\S+ )*\.(\s|$)", runs)


def test_dockerfile_runs_the_console_script_as_a_non_root_user() -> None:
    assert pyproject()["project"]["scripts"]["effectlog"] == "effectlog.cli.entry:main"
    assert instructions("ENTRYPOINT") == ['["effectlog"]']
    users = instructions("USER")
    assert users and users[-1] not in ("root", "0")
    assert [w for w, _ in dockerfile()].index("USER") > [w for w, _ in dockerfile()].index("RUN")


def test_dockerfile_health_check_hits_healthz_on_the_metrics_port() -> None:
    (check,) = instructions("HEALTHCHECK")
    assert f"127.0.0.1:{METRICS_PORT}/healthz" in check and "CMD" in check
    assert str(METRICS_PORT) in instructions("EXPOSE")[0]


def test_state_directory_is_private_and_owned_by_the_service_user() -> None:
    runs = " ".join(instructions("RUN"))
    assert "chmod 0700 /var/lib/effectlog" in runs and "chown" in runs


# -- .dockerignore -------------------------------------------------------------------------------

def test_dockerignore_keeps_secrets_and_clutter_out_but_not_the_build_inputs() -> None:
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for must in (".git", ".venv", ".env", ".effectlog", "tests"):
        assert must in patterns, must
    for needed in ("pyproject.toml", "README.md", "schemas", "effectlog", "projections",
                   "consumers", "effectlog/cli/main.py", "schemas/effect_event.v2.avsc"):
        assert not any(fnmatch.fnmatch(needed, p) or needed.startswith(p.rstrip("/") + "/")
                       for p in patterns), needed
