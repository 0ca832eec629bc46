"""``effectlog mcp``: effectlog in front of any MCP server (needs ``effectlog[mcp]``).

- :mod:`~effectlog.mcp.config`: the TOML file (upstream, effect tools), checked at start;
- :mod:`~effectlog.mcp.template`: target templates from a call's arguments;
- :mod:`~effectlog.mcp.operations`: where a call's operation id comes from;
- :mod:`~effectlog.mcp.upstream`: the reconnecting client of the upstream server;
- :mod:`~effectlog.mcp.effects`: one effect tool call, as ``@effectlog.effect`` performs it;
- :mod:`~effectlog.mcp.results`: what the agent gets back and what the log keeps;
- :mod:`~effectlog.mcp.server` and :mod:`~effectlog.mcp.app`: the proxy process.

The reconciler's side is the ``mcp:`` provider (:mod:`consumers.providers.mcp`).
"""
