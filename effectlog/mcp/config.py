"""The ``effectlog mcp`` configuration: the upstream server and which of its tools are effects.

A TOML file, read once into frozen dataclasses::

    [upstream]
    command = ["python", "-m", "payments_server"]   # or url = "http://127.0.0.1:9000/mcp"
    timeout = "30s"

    [effects.charge]
    kind = "payment.charge"
    target = "customer:{customer}"
    operation_id = "order_id"
    key_argument = "idempotency_key"
    lookup = "get_charge_by_idempotency_key"

:func:`load_config` refuses a malformed file and :func:`check_tools` a file that names tools or
arguments the upstream does not have, each with one line (:class:`InvalidInput`, exit 2).
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effectlog.durations import parse_duration_ms
from effectlog.errors import InvalidInput
from effectlog.keys import validate_kind
from effectlog.mcp.template import Template

DEFAULT_TIMEOUT_S = 60.0
PASSTHROUGH = ("all", "read-only")


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """Where the upstream server is: a command spawned over stdio, or a streamable-HTTP URL."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    retention_s: float = 0.0             # how long the upstream keeps results by key

    def describe(self) -> str:
        return self.url if self.url else shlex.join(self.command)


@dataclass(frozen=True, slots=True)
class ToolEffect:
    """How calls of one upstream tool become effects (see ``docs/mcp.md``)."""

    tool: str
    kind: str
    target: Template
    exclude: tuple[str, ...] = ()
    secret: tuple[str, ...] = ()
    operation_id: str | None = None      # the argument naming the operation, if any
    key_argument: str | None = None      # where the upstream gets the idempotency key
    epoch_argument: str | None = None    # ... and the fencing epoch
    lookup: str | None = None            # an upstream tool answering by idempotency key
    lookup_argument: str = "idempotency_key"
    lookup_complete: bool = False

    @property
    def injected(self) -> frozenset[str]:
        """Arguments the proxy sets itself (never part of the payload)."""
        return frozenset(a for a in (self.key_argument, self.epoch_argument) if a)

    @property
    def payload_ref(self) -> str | None:
        """What the log carries instead of a payload with secret arguments."""
        return "withheld:" + ",".join(self.secret) if self.secret else None

    def payload(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The effect's payload: the call's arguments but the excluded and injected ones."""
        dropped = self.injected | set(self.exclude)
        return {k: v for k, v in arguments.items() if k not in dropped}


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The whole file: the upstream, the effect tools by name, and what else passes."""

    upstream: UpstreamSpec
    effects: Mapping[str, ToolEffect]
    passthrough: str = "all"
    source: str = ""

    def by_kind(self, kind: str) -> ToolEffect | None:
        return next((e for e in self.effects.values() if e.kind == kind), None)

    def with_upstream(self, command: Iterable[str] = (), url: str | None = None) -> ProxyConfig:
        """This config with the upstream given on the command line instead."""
        command = tuple(command)
        if not command and url is None:
            return self
        if command and url:
            raise InvalidInput("give the upstream as a command or as --upstream-url, not both")
        upstream = UpstreamSpec(command=command, url=_url(url) if url else None,
                                env=self.upstream.env, cwd=self.upstream.cwd,
                                timeout_s=self.upstream.timeout_s,
                                retention_s=self.upstream.retention_s)
        return ProxyConfig(upstream, self.effects, self.passthrough, self.source)


_TOP = {"upstream", "effects", "proxy"}
_UPSTREAM = {"command", "url", "env", "cwd", "timeout", "retention"}
_PROXY = {"passthrough"}
_EFFECT = {"kind", "target", "exclude", "secret", "operation_id", "key_argument",
           "epoch_argument", "lookup", "lookup_argument", "lookup_complete"}


def load_config(path: str | Path) -> ProxyConfig:
    """Read and check a config file; :class:`InvalidInput` (one line) for anything wrong."""
    where = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput(f"no config file {where}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read config {where}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"config {where} is not TOML: {exc}") from None
    return parse_config(raw, where)


def parse_config(raw: Mapping[str, Any], where: str = "config") -> ProxyConfig:
    """The config from parsed TOML (see :func:`load_config`)."""
    _known(raw, _TOP, where)
    upstream = _upstream(_table(raw, "upstream", where), where)
    proxy = _table(raw, "proxy", where)
    _known(proxy, _PROXY, f"{where} [proxy]")
    passthrough = proxy.get("passthrough", "all")
    if passthrough not in PASSTHROUGH:
        raise InvalidInput(f"{where} [proxy] passthrough must be one of {', '.join(PASSTHROUGH)}")
    effects: dict[str, ToolEffect] = {}
    for tool, body in _table(raw, "effects", where).items():
        if not isinstance(body, dict):
            raise InvalidInput(f"{where}: effects.{tool} must be a table")
        effects[tool] = _effect(tool, body, f"{where} [effects.{tool}]")
    kinds: dict[str, str] = {}
    for effect in effects.values():
        if effect.kind in kinds:
            raise InvalidInput(f"{where}: kind {effect.kind!r} is used by tools "
                               f"{kinds[effect.kind]!r} and {effect.tool!r}: give each tool a "
                               "kind of its own (the key's kind names the tool)")
        kinds[effect.kind] = effect.tool
    return ProxyConfig(upstream, effects, passthrough, where)


def check_tools(config: ProxyConfig, schemas: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a config naming tools or arguments the upstream does not have.

    ``schemas`` maps each upstream tool to its input schema.
    """
    for effect in config.effects.values():
        where = f"{config.source} [effects.{effect.tool}]"
        if effect.tool not in schemas:
            raise InvalidInput(f"{where}: the upstream has no tool {effect.tool!r} "
                               f"(it has: {_names(schemas)})")
        known = _properties(schemas[effect.tool])
        named = {"target": effect.target.arguments, "exclude": effect.exclude,
                 "secret": effect.secret,
                 "operation_id": (effect.operation_id,) if effect.operation_id else (),
                 "key_argument": (effect.key_argument,) if effect.key_argument else (),
                 "epoch_argument": (effect.epoch_argument,) if effect.epoch_argument else ()}
        for what, names in named.items():
            missing = sorted(n for n in names if n not in known)
            if missing:
                raise InvalidInput(f"{where}: {what} names argument(s) {', '.join(missing)} that "
                                   f"tool {effect.tool!r} does not take ({_names(known)})")
        if effect.lookup is not None:
            if effect.lookup not in schemas:
                raise InvalidInput(f"{where}: the upstream has no lookup tool {effect.lookup!r}")
            if effect.lookup_argument not in _properties(schemas[effect.lookup]):
                raise InvalidInput(f"{where}: lookup tool {effect.lookup!r} takes no argument "
                                   f"{effect.lookup_argument!r} (set lookup_argument)")


# -- parts -------------------------------------------------------------------------------


def _upstream(body: Mapping[str, Any], where: str) -> UpstreamSpec:
    _known(body, _UPSTREAM, f"{where} [upstream]")
    command = body.get("command", ())
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list | tuple) or not all(isinstance(a, str) for a in command):
        raise InvalidInput(f"{where} [upstream] command must be a string or a list of strings")
    url = body.get("url")
    if command and url:
        raise InvalidInput(f"{where} [upstream]: give a command or a url, not both")
    env = body.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise InvalidInput(f"{where} [upstream] env must be a table of strings")
    cwd = body.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise InvalidInput(f"{where} [upstream] cwd must be a string")
    return UpstreamSpec(command=tuple(command), url=_url(url) if url is not None else None,
                        env=dict(env), cwd=cwd,
                        timeout_s=_seconds(body.get("timeout", DEFAULT_TIMEOUT_S),
                                           f"{where} [upstream] timeout"),
                        retention_s=_seconds(body["retention"], f"{where} [upstream] retention")
                        if "retention" in body else 0.0)


def _effect(tool: str, body: Mapping[str, Any], where: str) -> ToolEffect:
    _known(body, _EFFECT, where)
    for required in ("kind", "target"):
        if required not in body:
            raise InvalidInput(f"{where}: {required} is required")
    try:
        kind = validate_kind(_str(body, "kind", where))
        target = Template.parse(_str(body, "target", where))
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    exclude, secret = _names_list(body, "exclude", where), _names_list(body, "secret", where)
    key, epoch = _opt_str(body, "key_argument", where), _opt_str(body, "epoch_argument", where)
    overlap = (set(exclude) | set(secret)) & {key, epoch}
    if overlap:
        raise InvalidInput(f"{where}: {', '.join(sorted(str(o) for o in overlap))} is set by the "
                           "proxy (key_argument/epoch_argument): do not exclude it")
    complete = body.get("lookup_complete", False)
    if not isinstance(complete, bool):
        raise InvalidInput(f"{where}: lookup_complete must be true or false")
    return ToolEffect(tool=tool, kind=kind, target=target, exclude=exclude, secret=secret,
                      operation_id=_opt_str(body, "operation_id", where),
                      key_argument=key, epoch_argument=epoch,
                      lookup=_opt_str(body, "lookup", where),
                      lookup_argument=_opt_str(body, "lookup_argument", where) or "idempotency_key",
                      lookup_complete=complete)


def _table(raw: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: [{name}] must be a table")
    return value


def _known(body: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(unknown)} "
                           f"(known: {', '.join(sorted(allowed))})")


def _str(body: Mapping[str, Any], name: str, where: str) -> str:
    value = body[name]
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{where}: {name} must be a non-empty string")
    return value


def _opt_str(body: Mapping[str, Any], name: str, where: str) -> str | None:
    return _str(body, name, where) if name in body else None


def _names_list(body: Mapping[str, Any], name: str, where: str) -> tuple[str, ...]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidInput(f"{where}: {name} must be a list of argument names")
    return tuple(value)


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise InvalidInput(f"{where} must be a duration such as 30s")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = parse_duration_ms(value) / 1000
    else:
        raise InvalidInput(f"{where} must be a duration such as 30s")
    if seconds <= 0:
        raise InvalidInput(f"{where} must be positive")
    return seconds


def _url(url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidInput(f"upstream url {url!r} must be an http:// or https:// URL")
    return url


def _properties(schema: Mapping[str, Any]) -> set[str]:
    properties = schema.get("properties")
    return set(properties) if isinstance(properties, dict) else set()


def _names(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(listed[:20]) + (", …" if len(listed) > 20 else "") if listed else "none"
