"""Provider adapters: the bundled fake, the HTTP Idempotency-Key adapter, MCP tools, and a
factory."""

from __future__ import annotations

import importlib

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.provider import Provider, ProviderTimeout, ProviderUnavailable

__all__ = ["load_provider"]


def load_provider(spec: str) -> Provider:
    """The provider named by ``spec``.

    - ``fake:///path/provider.db[?lookup_complete=0&dedupe=0&retention_s=N]``: the fake;
    - ``http://host:port[?lookup_complete=1&retention_s=N&timeout_s=S]``: the HTTP adapter;
    - ``mcp:///path/effects.toml``: the tools of an ``effectlog mcp`` upstream, by its config;
    - ``package.module:factory``: a user's adapter, ``factory()`` returning a provider.
    """
    if spec.startswith("fake://"):
        from consumers.providers.fake import FakeProvider

        return FakeProvider.from_url(spec)
    if spec.startswith("http://"):
        from consumers.providers.http import HttpProvider

        return HttpProvider.from_url(spec)
    if spec.startswith("mcp:"):
        from consumers.providers.mcp_tools import McpToolsProvider

        return McpToolsProvider.from_url(spec)
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute or "/" in spec:
        raise InvalidInput(f"bad provider {spec!r}: use module:factory, fake:///path.db, "
                           "http://host:port or mcp:///path/effects.toml")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"cannot load provider {spec!r}: {exc}") from exc
    try:
        provider = factory() if callable(factory) and not isinstance(factory, Provider) \
            else factory
    except (ProviderUnavailable, ProviderTimeout) as exc:  # at start: an outage (exit 4)
        raise BackendUnavailable(f"provider {spec} unreachable: {exc}") from None
    if not isinstance(provider, Provider):
        raise InvalidInput(f"{spec} did not give a provider (needs execute, lookup, "
                           "lookup_complete and retention_s)")
    return provider
