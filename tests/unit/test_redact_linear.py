"""Secret scrubbing is linear in the length of its input (every CLI error line and log line is
scrubbed, and error lines quote user input): 1 MiB of each adversarial family is scrubbed.

The quadratic patterns took 7 s on 16 KiB and would run for hours on 1 MiB; the timeout is
a bound no linear scrubber comes near (bench/redact.py gives the figures), not a timing."""

from __future__ import annotations

import pytest

from effectlog.redact import SecretRegistry, mask_patterns, scrub_text
from tests.adversarial_text import FAMILIES

MIB = 1024 * 1024


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_mebibyte_of_adversarial_text_is_scrubbed(family: str) -> None:
    text = FAMILIES[family](MIB)
    scrubbed = scrub_text(text, SecretRegistry())
    if family == "secret pairs":
        assert "x" * 50 not in scrubbed and scrubbed.count("password=***") == MIB // 60
    else:
        assert len(scrubbed) >= len(text) // 2  # nothing else is secret: kept (masks shorten)


@pytest.mark.parametrize(("text", "masked"), [
    ("--sasl-password=hunter2 --user=ada", "--sasl-password=*** --user=ada"),
    ("_password=hunter2", "_password=***"),
    ("9token=abc", "9token=***"),
    ("x.a://user:hunter2@host", "x.a://user:***@host"),
    ("1.a://user:hunter2@host", "1.a://user:***@host"),
    ("'api_token': 'a\\'b' rest", "'api_token': '***' rest"),
])
def test_names_inside_runs_of_name_characters_are_still_masked(text: str, masked: str) -> None:
    assert mask_patterns(text) == masked
