from __future__ import annotations

import pytest

from effectlog.log import EventLog, open_log
from tests.log_contract import LogContract


class TestMemoryLog(LogContract):
    @pytest.fixture
    def log(self) -> EventLog:
        return open_log("memory://")
