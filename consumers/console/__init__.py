"""The web console of ``effectlog serve``: effects in doubt, key timelines, decisions.

Served at ``/`` on the node's HTTP server (see :mod:`consumers.console.routes`); reads
through the node's query API and the log, writes decisions as ``effectlog approve`` does.
"""

from consumers.console.routes import ConsoleSettings, console_routes

__all__ = ["ConsoleSettings", "console_routes"]
