"""An upstream MCP server for the ``effectlog mcp`` tests, written with the SDK.

Its tools do not deduplicate: every call they receive is performed and counted in a SQLite
file (table ``calls``: tool, arguments, ``_meta``), so a second dispatch of one logical
effect shows up as a second row. ``charge`` stores a charge that
``get_charge_by_idempotency_key`` finds again by the key it was given; while a file ``hold``
sits beside the database, ``charge`` counts the call and then waits (at most 60 s) for a file
``release``, so a test can kill the proxy while the call is in flight.

    python -m tests.mcp_upstream --db PATH [--http PORT]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

HOLD_LIMIT_S = 60.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (n INTEGER PRIMARY KEY, tool TEXT, arguments TEXT, meta TEXT);
CREATE TABLE IF NOT EXISTS charges (n INTEGER PRIMARY KEY, key TEXT, customer TEXT, amount INT);
"""


def connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return conn


def calls(db: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """Every call the upstream received (of ``tool``), in order."""
    conn = connect(db)
    try:
        rows = conn.execute("SELECT tool, arguments, meta FROM calls ORDER BY n").fetchall()
    finally:
        conn.close()
    return [{"tool": t, "arguments": json.loads(a), "meta": json.loads(m)} for t, a, m in rows
            if tool is None or t == tool]


def build(db: Path) -> MCPServer:
    app = MCPServer("counting-upstream", instructions="Payments and mail, for tests.")
    conn = connect(db)

    def count(tool: str, arguments: dict[str, Any], ctx: Context) -> int:
        meta = dict(ctx.request_context.meta or {})
        meta = {k: v for k, v in meta.items() if not k.startswith("io.modelcontextprotocol/")}
        cur = conn.execute("INSERT INTO calls (tool, arguments, meta) VALUES (?, ?, ?)",
                           (tool, json.dumps(arguments), json.dumps(meta)))
        return int(cur.lastrowid or 0)

    async def hold() -> None:
        if not (db.parent / "hold").exists():
            return
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not (db.parent / "release").exists() and time.monotonic() < deadline:
            await anyio.sleep(0.02)

    @app.tool()
    async def charge(customer: str, amount: int, ctx: Context, idempotency_key: str = "",
                     fencing_epoch: int = 0, note: str = "") -> dict[str, Any]:
        """Charge a customer (every call charges: this server does not deduplicate)."""
        count("charge", {"customer": customer, "amount": amount, "note": note,
                         "idempotency_key": idempotency_key, "fencing_epoch": fencing_epoch}, ctx)
        if amount <= 0:
            raise ToolError("amount must be positive")
        cur = conn.execute("INSERT INTO charges (key, customer, amount) VALUES (?, ?, ?)",
                           (idempotency_key, customer, amount))
        await hold()
        return {"charge_id": f"ch_{cur.lastrowid}", "customer": customer, "amount": amount}

    @app.tool()
    async def get_charge_by_idempotency_key(idempotency_key: str) -> dict[str, Any]:
        """The charge made under a key, or found: false."""
        row = conn.execute("SELECT n, customer, amount FROM charges WHERE key = ? ORDER BY n "
                           "LIMIT 1", (idempotency_key,)).fetchone()
        if row is None:
            return {"found": False}
        return {"charge_id": f"ch_{row[0]}", "customer": row[1], "amount": row[2]}

    @app.tool()
    async def send_email(to: str, subject: str, ctx: Context, trace_id: str = "",
                         message_id: str = "") -> str:
        """Send one email (every call sends)."""
        n = count("send_email", {"to": to, "subject": subject, "trace_id": trace_id,
                                 "message_id": message_id}, ctx)
        return f"sent #{n} to {to}"

    @app.tool()
    async def slow_charge(customer: str, amount: int, delay_s: float, ctx: Context) -> str:
        """A charge whose answer takes ``delay_s`` seconds."""
        count("slow_charge", {"customer": customer, "amount": amount}, ctx)
        await anyio.sleep(delay_s)
        return "charged slowly"

    @app.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def get_balance(customer: str, ctx: Context) -> dict[str, Any]:
        """A customer's balance (read-only)."""
        count("get_balance", {"customer": customer}, ctx)
        return {"customer": customer, "balance": 100}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--http", type=int, default=None)
    args = parser.parse_args()
    app = build(args.db)
    if args.http is None:
        app.run()
    else:
        app.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
