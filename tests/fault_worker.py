"""A worker process for the broker fault tests: the demo's worker, with short timeouts.

One job per stdin line (``{"op", "kind", "target", "payload"}``), one reply line each, as
:mod:`effectlog.cli.demo.worker_main` answers it (``status``: succeeded, in_doubt, unknown,
superseded, or error for ``BackendUnavailable`` with its ``detail``; ``ack``; the ``events``
its appends got back), plus ``elapsed_s``, how long the job took. State is read through
``serve`` (``--server``, the judge) with every wait bounded by ``--timeout`` seconds: the
reads, the verdicts, the retries of questions nobody could answer.

    python -m tests.fault_worker --log URL --provider fake:///p.db --server URL --id W
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time

from consumers.providers import load_provider
from effectlog.cli.demo.worker_main import CrashingWorker, run_job
from effectlog.judge.client import ClusterJudge
from effectlog.log import open_log

STACKS_AFTER_S = 40.0  # well past the longest perform the tests allow (8 x the timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    provider = load_provider(args.provider)
    judge = ClusterJudge(args.server, timeout_s=args.timeout, wait_s=args.timeout,
                         retry_for_s=args.timeout)
    log = open_log(args.log)
    worker = CrashingWorker(log, args.id, judge=judge, accept_timeout_s=args.timeout)
    for line in sys.stdin:
        started = time.monotonic()
        # a job past any of its bounds leaves every thread's stack on stderr (the test prints it)
        faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=False)
        reply = run_job(worker, provider, json.loads(line))
        faulthandler.cancel_dump_traceback_later()
        reply["elapsed_s"] = round(time.monotonic() - started, 3)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
