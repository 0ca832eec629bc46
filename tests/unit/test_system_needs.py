"""The run's last line names the system packages this machine still lacks, and only those."""

from __future__ import annotations

import pytest

from tests import system_needs


def test_nothing_is_said_when_nothing_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_needs, "NEEDS", (("a", "x", lambda: True),))
    assert system_needs.missing_line() is None


def test_what_lacks_is_named_with_its_use_and_the_install_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_needs, "NEEDS", (("chromium", "the browser test", lambda: False),
                                                ("javac-pkg", "javac", lambda: False),
                                                ("here", "present", lambda: True)))
    assert system_needs.missing_line() == (
        "system packages still needed: chromium (the browser test), javac-pkg (javac): "
        "apt-get install chromium javac-pkg (.ci/run installs them)")

