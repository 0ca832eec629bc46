"""Secrets in URLs and client configs never reach logs, help texts or error messages."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from effectlog.cli.main import cli
from effectlog.redact import (
    MASK,
    RedactingFilter,
    SecretRegistry,
    is_secret_name,
    mask_patterns,
    redact_mapping,
    redact_url,
    register_url_secrets,
    scrub_text,
    secrets_in_url,
)

SECRET = "s3cret-Pa55"
URL = f"kafka://h:9092?prefix=effects&sasl_username=u&sasl_password={SECRET}&timeout_s=1"


@pytest.fixture
def registry() -> Iterator[SecretRegistry]:
    from effectlog.redact import SECRETS

    saved = SECRETS._values
    yield SECRETS
    SECRETS._values = saved


@pytest.mark.parametrize("name", [
    "password", "sasl_password", "sasl.password", "ssl.key.password", "ssl_keystore_password",
    "ssl.truststore.password", "sasl.jaas.config", "sasl.oauthbearer.client.secret",
    "api-token", "API_KEY", "ssl.key.pem", "Authorization", "credentials",
])
def test_secret_names_are_recognised(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["prefix", "sasl_username", "bootstrap.servers", "ssl_cafile",
                                  "security_protocol", "config", "sasl.oauthbearer.token.endpoint.url"])
def test_ordinary_names_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_url_secrets_are_masked_and_the_rest_is_kept() -> None:
    assert redact_url(URL) == ("kafka://h:9092?prefix=effects&sasl_username=u"
                               "&sasl_password=***&timeout_s=1")
    assert redact_url("kafka+sasl://alice:pa%40ss@h1:9092,h2:9092?prefix=x") == (
        "kafka+sasl://alice:***@h1:9092,h2:9092?prefix=x")
    assert redact_url("kafka://h:9092?ssl_key_password=k&token=t#frag") == (
        "kafka://h:9092?ssl_key_password=***&token=***#frag")
    for plain in ("sqlite:////var/lib/effectlog/log.db", "memory://",
                  "kafka://h:9092?prefix=e&config=/etc/effectlog/client.properties"):
        assert redact_url(plain) == plain


def test_secret_values_of_a_url_are_found_encoded_and_decoded() -> None:
    found = secrets_in_url("kafka://alice:pa%40ss@h:9092?sasl_password=a%26b&prefix=x")
    assert {"pa%40ss", "pa@ss", "a%26b", "a&b"} <= set(found)
    assert "alice" not in found and "x" not in found


def test_config_mappings_are_masked_recursively() -> None:
    config = {"bootstrap.servers": "h:9092", "sasl.password": SECRET, "security.protocol": "SASL_SSL",
              "nested": {"ssl.key.password": SECRET, "n": 3}, "sasl.username": "u",
              "url": f"kafka://u:{SECRET}@h:9092", "empty.password": ""}
    masked = redact_mapping(config)
    assert SECRET not in repr(masked)
    assert masked["sasl.password"] == MASK and masked["nested"]["ssl.key.password"] == MASK
    assert masked["bootstrap.servers"] == "h:9092" and masked["nested"]["n"] == 3
    assert masked["empty.password"] == ""
    assert config["sasl.password"] == SECRET  # the original is untouched


def test_free_text_patterns_cover_reprs_properties_and_jaas() -> None:
    text = (f"conf={{'sasl.password': '{SECRET}', 'acks': 'all'}} "
            f"KafkaSettings(sasl_password='{SECRET}') "
            f'sasl.jaas.config=org.apache.PlainLoginModule required username="u" password="{SECRET}";')
    masked = mask_patterns(text)
    assert SECRET not in masked
    assert "'acks': 'all'" in masked and 'username="u"' in masked


def test_registered_values_are_scrubbed_anywhere(registry: SecretRegistry) -> None:
    registry.add("tok-123456")
    registry.add("ab")  # too short to scrub as a substring
    assert scrub_text("librdkafka: auth failed for tok-123456 (tok-123456)") == (
        "librdkafka: auth failed for *** (***)")
    assert scrub_text("about") == "about"


def test_secrets_never_reach_captured_log_output(caplog: pytest.LogCaptureFixture,
                                                 registry: SecretRegistry) -> None:
    register_url_secrets(URL)
    caplog.handler.addFilter(RedactingFilter())
    logger = logging.getLogger("effectlog.log.kafka")
    with caplog.at_level(logging.DEBUG):
        logger.info("opening %s", URL)
        logger.warning("client config %s", {"sasl.password": SECRET, "acks": "all"})
        logger.debug("settings", extra={"url": URL, "config": {"sasl.password": SECRET}})
        try:
            raise ConnectionError(f"SASL authentication failed: bad password {SECRET}")
        except ConnectionError:
            logger.exception("broker said no")
        logger.error("raw value %s leaked?", SECRET)
    assert len(caplog.records) == 5
    assert SECRET not in caplog.text
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(vars(record))
    assert "sasl_username=u" in caplog.text and "broker said no" in caplog.text


def test_help_texts_never_show_the_log_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECTLOG_LOG", URL)
    runner = CliRunner()
    commands = [["--help"], ["--log", URL, "--help"], ["--log", URL, "replay", "--help"]]
    if importlib.util.find_spec("effectlog.cli.read_commands") is not None:
        commands.append(["--log", URL, "stats", "--help"])
    for args in commands:
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, (args, result.output)
        assert SECRET not in result.output, args


def test_kafka_log_never_shows_its_password() -> None:
    pytest.importorskip("confluent_kafka")
    if importlib.util.find_spec("effectlog.log.kafka") is None:
        pytest.skip("no kafka backend")
    from effectlog.log import open_log

    log = open_log(URL)  # no network in the constructor
    try:
        assert SECRET not in log.url and SECRET not in repr(log)
        assert SECRET not in repr(getattr(log, "settings", ""))
    finally:
        log.close()


def test_unreachable_broker_error_does_not_reveal_the_password() -> None:
    pytest.importorskip("confluent_kafka")
    if importlib.util.find_spec("effectlog.log.kafka") is None:
        pytest.skip("no kafka backend")
    url = f"kafka://127.0.0.1:1?timeout_s=1&sasl_username=u&sasl_password={SECRET}"
    proc = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "replay"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4
    assert "error:" in proc.stderr and SECRET not in proc.stdout + proc.stderr


def test_errors_about_a_bad_url_do_not_echo_its_password() -> None:
    result = CliRunner().invoke(cli, ["--log", f"kafkaz://u:{SECRET}@h:9092", "replay"])
    assert SECRET not in result.output + str(result.exception or "")
