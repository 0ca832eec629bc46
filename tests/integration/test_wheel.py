"""The built wheel works outside the source tree: schemas load, the console script runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dependencies_without_effectlog(tmp_path: Path) -> Path:
    """This run's installed packages minus effectlog's own (its editable install), as a
    directory for PYTHONPATH: pip then finds every dependency installed and needs no index."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in purelib.iterdir():
        if not entry.name.lower().startswith(("effectlog", "__editable__")):
            (deps / entry.name).symlink_to(entry)
    return deps


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path: Path) -> None:
    """``make dist`` builds the wheel without a setuptools warning; ``make install`` puts it
    in a venv of its own with the langgraph extra and links ``bin/effectlog``."""
    dist, prefix = tmp_path / "dist", tmp_path / "prefix"
    # PIP_FLAGS=--no-index: every dependency is found installed through PYTHONPATH
    env = {**os.environ, "PYTHONPATH": str(_dependencies_without_effectlog(tmp_path))}
    built = subprocess.run(["make", "-s", "-C", str(ROOT), "dist", "install", f"DIST={dist}",
                            f"PREFIX={prefix}", f"PYTHON={sys.executable}", "EXTRAS=langgraph",
                            "PIP_FLAGS=--no-index"], env=env, timeout=600,
                           capture_output=True, text=True)
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-3000:]
    assert "Warning" not in output and "absent from the `packages`" not in output, output[-3000:]
    assert "project.license" not in output  # no deprecation warning
    assert f"effectlog installed: {prefix}/bin/effectlog" in output
    env_dir = prefix / "share" / "effectlog" / "venv"
    py = env_dir / "bin" / "python"
    assert (prefix / "bin" / "effectlog").resolve() == (env_dir / "bin" / "effectlog").resolve()
    extras = subprocess.run([str(py), "-c", "import importlib.metadata as m, langgraph;"
                             "print(m.distribution('effectlog').metadata.get_all('Provides-Extra'))"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert "langgraph" in extras.stdout, extras.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = ("import effectlog, importlib.resources as r, json;"
             "print(json.dumps([effectlog.__file__, effectlog.__version__,"
             " sorted(p.name for p in r.files('effectlog.schemas').iterdir()"
             " if p.name.endswith('.avsc'))]))")
    out = subprocess.run([str(py), "-c", probe], cwd=work, env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    location, version, schemas = json.loads(out.stdout)
    assert str(env_dir) in location and version == "0.1.0"
    shown = subprocess.run([str(prefix / "bin" / "effectlog"), "--version"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == "effectlog, version 0.1.0"
    assert schemas == ["effect_event.v2.avsc", "reconciliation_command.v1.avsc"]
    console = ("import importlib.resources as r; from consumers.console.pages import environment;"
               "[environment().get_template(t) for t in ('overview.html', 'list.html',"
               " 'effect.html', 'login.html', 'error.html')];"
               "print(sorted(p.name for p in (r.files('consumers.console') / 'static').iterdir()))")
    shipped = subprocess.run([str(py), "-c", console], cwd=work, env=env, capture_output=True,
                             text=True, timeout=60)
    assert shipped.stdout.strip() == "['console.css', 'console.js', 'favicon.svg']", shipped.stderr
    line = json.dumps({"operation_id": "op-1", "kind": "email.send", "target": "t",
                       "payload": {}, "transition": "create", "worker_id": "w"})
    run = subprocess.run([str(env_dir / "bin" / "effectlog"), "--log", "sqlite:///log.db",
                          "append"], input=line + "\n", cwd=work, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["state"] == "CREATED"
    for command in ("demo", "project", "reconcile", "serve", "replay", "get", "mcp"):
        helped = subprocess.run([str(env_dir / "bin" / "effectlog"), command, "--help"],
                                cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert helped.returncode == 0, (command, helped.stderr)
