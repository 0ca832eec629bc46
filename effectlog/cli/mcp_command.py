"""``effectlog mcp``: an MCP server in front of another one, its side-effecting tools made
effects on the log (see ``docs/mcp.md``)."""

from __future__ import annotations

import click

from effectlog.cli.context import CliContext
from effectlog.errors import EffectlogError, InvalidInput

DEFAULT_PATH = "/mcp"


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--config", "config_path", required=True, metavar="FILE",
              type=click.Path(dir_okay=False),
              help="TOML file: the upstream and which of its tools are effects.")
@click.option("--http", "http", default=None, metavar="HOST:PORT",
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
@click.option("--upstream-url", default=None, metavar="URL",
              help="A streamable-HTTP upstream (instead of the config's [upstream]).")
@click.option("--run-id", envvar="EFFECTLOG_RUN_ID", show_envvar=True, default=None,
              help="Run id that numbers calls without an idempotency key or operation "
                   "argument (default: one made up per process; a request's "
                   "_meta effectlog/runId wins).")
@click.option("--server", envvar="EFFECTLOG_SERVER", show_envvar=True, default=None,
              metavar="URL", help="An effectlog serve instance to read state through "
                                  "(required on a Kafka log).")
@click.option("--worker-id", default=None, help="Writer identity (default mcp:HOST:PID).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ARGS...]")
@click.pass_obj
def mcp(obj: CliContext, config_path: str, http: str | None, upstream_url: str | None,
        run_id: str | None, server: str | None, worker_id: str | None,
        command: tuple[str, ...]) -> None:
    """Serve an upstream MCP server's tools (spawned from COMMAND over stdio, or at a URL)
    over stdio or streamable HTTP, each tool the config names performed as an effect:
    at most once per key, replayed from the log, in doubt when no answer came."""
    try:
        import mcp as _sdk  # noqa: F401
    except ImportError:
        raise InvalidInput("effectlog mcp needs the MCP SDK: pip install 'effectlog[mcp]'") \
            from None
    import anyio

    from effectlog.cli.serve_command import parse_http
    from effectlog.mcp.app import ProxySettings, run_proxy
    from effectlog.mcp.config import load_config
    from effectlog.mcp.operations import checked_run_id
    from effectlog.mcp.server import Listening

    config = load_config(config_path).with_upstream(command, upstream_url)
    if not config.upstream.command and not config.upstream.url:
        raise InvalidInput("no upstream: set [upstream] command or url in the config, give "
                           "--upstream-url, or the command after --")
    listening = Listening()
    if http is not None:
        host, port = parse_http(http)
        listening = Listening(host, port, DEFAULT_PATH)
    settings = ProxySettings(listening=listening,
                             run_id=checked_run_id(run_id) if run_id is not None else None,
                             server=server)
    if worker_id:
        settings = ProxySettings(listening, settings.run_id, worker_id, server)
    try:
        anyio.run(run_proxy, config, lambda: obj.open_log(create=True), settings)
    except BaseExceptionGroup as group:
        raise first_error(group) from None


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report for a task group that failed: effectlog's own first."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return next((e for e in leaves if isinstance(e, EffectlogError)), leaves[0] if leaves else group)
