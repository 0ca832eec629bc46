"""Rendering the console: the Jinja2 environment and what its templates are given.

Every value a template prints passes :func:`effectlog.text.printable` (control, format and bidi
characters become visible escapes: a key or reason cannot reorder or hide text) and then
HTML escaping (autoescape), so keys, worker ids, reasons and payloads may hold markup.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from effectlog.model import recorded_by
from effectlog.text import printable

#: States in the order the console shows them: the ones that need a person first.
STATE_ORDER = ("AWAITING_APPROVAL", "UNKNOWN", "DISPATCHED", "RESERVED", "CREATED", "FAILED",
               "ABANDONED", "SUCCEEDED")
IN_DOUBT = ("AWAITING_APPROVAL", "UNKNOWN")
DECIDABLE = frozenset(IN_DOUBT)
STATE_NOTES = {
    "AWAITING_APPROVAL": "parked for a person: retry with the same key, or abandon",
    "UNKNOWN": "the provider call may or may not have happened; never retried blindly",
    "DISPATCHED": "the call is under way (or its worker died: recovery will look it up)",
    "RESERVED": "claimed by a worker, not sent yet",
    "CREATED": "recorded, not claimed yet",
    "FAILED": "the provider said no",
    "ABANDONED": "a person decided not to perform it",
    "SUCCEEDED": "done, with the provider's result",
}


def _finalize(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


def age(at_ms: int, now_ms: int | None = None) -> str:
    """How long ago ``at_ms`` was, in two units: ``42s``, ``3m 12s``, ``5h 07m``, ``2d 4h``."""
    seconds = max(0, ((now_ms if now_ms is not None else int(time.time() * 1000)) - at_ms)
                  // 1000)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def utc(at_ms: int) -> str:
    """``2025-05-01 12:00:03.123Z``."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def key_path(key: str) -> str:
    """The console URL of a key's page."""
    return "/effects/" + quote(key, safe="")


def list_url(state: str, **params: str | None) -> str:
    """The console URL of a state's list with the given filters."""
    query = {"state": state, **{k: v for k, v in params.items() if v}}
    return "/effects?" + urlencode(query)


def detail(event: dict[str, Any]) -> str:
    """What a transition says besides its state: a decision, an outcome or an error."""
    approval, outcome = event.get("approval"), event.get("outcome")
    if event.get("transition") == "APPROVE" and approval:
        return f"{approval['decision']} by {approval['by']}: {approval['reason']}"
    if event.get("transition") == "RECORD" and outcome:
        result = _json_text(outcome.get("result"))
        return f"{outcome['status']} ({recorded_by(outcome.get('source'))}): {result[:200]}"
    if event.get("error"):
        return str(event["error"])
    return ""


_RUN_OPERATION = re.compile(r"(.+)\.([0-9]+)")


def run_of(operation_id: str) -> str | None:
    """The run id of an operation numbered by ``effectlog.run`` (``{run_id}.{n}``), else None."""
    found = _RUN_OPERATION.fullmatch(operation_id)
    return found.group(1) if found else None


def run_key_prefix(run_id: str) -> str:
    """The key prefix every effect of run ``run_id`` shares: ``agent:{run_id}.``."""
    return f"agent:{run_id}."


def call_number(snapshot: dict[str, Any]) -> int:
    """The ``n`` of an operation id ``{run_id}.{n}`` (its place in the run), or 0."""
    found = _RUN_OPERATION.fullmatch(str(snapshot.get("operation_id", "")))
    return int(found.group(2)) if found else 0


def next_step(e: dict[str, Any], *, reconciles: bool, deadline_s: float, poll_s: float,
              now_ms: int) -> str | None:
    """What happens to the effect next, and when, as the console tells it after a decision
    (None when nothing is pending)."""
    approval = e.get("approval") or {}
    if e["state"] == "ABANDONED":
        return f"Done: abandoned by {approval.get('by', 'a person')}; nothing will be sent."
    if e["state"] == "RESERVED" and approval.get("decision") == "RETRY":
        if not reconciles:
            return ("Next: nothing here sends it (this serve runs no reconciler: it was started "
                    "with --no-recovery). `effectlog reconcile --once --provider SPEC --server "
                    "URL` sends it with the same key, or the job's own worker when the job is "
                    "delivered again.")
        due_ms = int(e["occurred_at"]) + int(deadline_s * 1000)
        when = utc(due_ms) if due_ms > now_ms else "now"
        wait = f" (in {age(now_ms, due_ms)})" if due_ms > now_ms else ""
        return (f"Next: the reconciler of its partition sends it again with the same key at "
                f"epoch {e['fencing_epoch']} within seconds (the decision asked it to); if that "
                f"request was lost, recovery takes it up at {when}{wait}, {deadline_s:g}s after "
                f"the decision (its deadline for {e['kind']}), within {poll_s:g}s of that.")
    if e["state"] == "DISPATCHED" and approval.get("decision") == "RETRY":
        return "Sent again with the same key after the retry decision: waiting for the outcome."
    return None


def payload_text(event: dict[str, Any]) -> str | None:
    """The payload as pretty JSON when the event carries it on the log (never a
    ``payload_ref``'s content, which is not on the log)."""
    if event.get("payload_ref"):
        return None
    if event.get("payload_b64") is not None:
        return f"(not JSON, base64) {event['payload_b64']}"
    if event.get("payload") is None:
        return None
    return _json_text(event["payload"], indent=2)


def header(stats: dict[str, Any] | None) -> dict[str, Any]:
    """The counts and lag shown on top of every page (None: the API did not answer)."""
    if stats is None:
        return {"ok": False}
    states = stats.get("states", {})
    lag = {int(p): n for p, n in stats.get("lag", {}).items()}
    return {"ok": True, "counts": [(s, states.get(s, 0)) for s in STATE_ORDER],
            "lag": lag, "lag_total": sum(lag.values()),
            "rejected": stats.get("rejected_total", 0),
            "members": stats.get("members", {}), "unserved": stats.get("unserved", [])}


def environment() -> Environment:
    """The templates under ``consumers/console/templates``, escaping everything."""
    env = Environment(loader=PackageLoader("consumers.console", "templates"),
                      autoescape=select_autoescape(["html"]), finalize=_finalize,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(age=age, utc=utc, key_path=key_path, detail=detail, recorded_by=recorded_by)
    env.globals.update(STATE_NOTES=STATE_NOTES, list_url=list_url, DECIDABLE=DECIDABLE,
                       payload_text=payload_text, run_of=run_of)
    return env


def _json_text(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON text, its Unicode as it is; escaped where it holds a lone surrogate
    (a result recorded as a provider sent it), which no page could encode."""
    text = json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, indent=indent, sort_keys=True)
    return text
