"""The built wheel works outside the source tree: schemas load, the console script runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "-w", str(dist), str(ROOT)], check=True, timeout=300,
                           capture_output=True, text=True)
    assert "project.license" not in built.stdout + built.stderr  # no deprecation warning
    wheel = next(dist.glob("effectlog-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   timeout=300)
    # Dependencies come from this test run's environment; PYTHONPATH does not process .pth
    # files, so the editable install of the source tree stays invisible.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
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
    shown = subprocess.run([str(env_dir / "bin" / "effectlog"), "--version"], cwd=work, env=env,
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
