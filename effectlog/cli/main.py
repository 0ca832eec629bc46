"""The ``effectlog`` command: a click group whose commands are imported only when run.

Global options are read once here and handed to commands in :class:`CliContext`; errors
from the exception tree become one-line messages and the documented exit codes.
"""

from __future__ import annotations

import importlib
import logging
from typing import NoReturn

import click
from click.core import ParameterSource

from effectlog.cli.context import DEFAULT_TIMEOUT_S, CliContext, with_timeout

#: command name -> "module:attribute"; each module owns its command(s).
COMMANDS: dict[str, str] = {
    "append": "effectlog.cli.log_commands:append",
    "history": "effectlog.cli.log_commands:history",
    "topics": "effectlog.cli.log_commands:topics",
    "get": "effectlog.cli.read_commands:get",
    "list": "effectlog.cli.read_commands:list_effects",
    "stats": "effectlog.cli.read_commands:stats",
    "project": "effectlog.cli.project_commands:project",
    "rebuild": "effectlog.cli.project_commands:rebuild",
    "recover": "effectlog.cli.recovery_commands:recover",
    "reconcile": "effectlog.cli.recovery_commands:reconcile",
    "approve": "effectlog.cli.recovery_commands:approve",
    "fake-provider": "effectlog.cli.recovery_commands:fake_provider",
    "serve": "effectlog.cli.serve_command:serve",
    "replay": "effectlog.cli.replay_command:replay",
    "expire": "effectlog.cli.expire_command:expire",
    "demo": "effectlog.cli.demo_command:demo",
    "mcp": "effectlog.cli.mcp_command:mcp",
    "console-users": "effectlog.cli.console_users_command:console_users",
}

HELP: dict[str, str] = {
    "append": "Append transitions read as JSON lines on stdin (for non-Python workers).",
    "history": "Show every event of one key, read from the log.",
    "topics": "Create (or check) and delete the Kafka topics.",
    "get": "Show the current state of one key from the projection.",
    "list": "List effects by state and age (an index range scan).",
    "stats": "Counts by state, rejected events by reason, lag and metrics.",
    "project": "Run the projector: log -> RocksDB.",
    "rebuild": "Rebuild the projection from the log and swap it in atomically.",
    "recover": "Find stuck effects and emit reconciliation commands.",
    "reconcile": "Settle stuck effects by provider lookup, per the recovery table.",
    "approve": "Decide on an effect awaiting approval: retry or abandon.",
    "fake-provider": "Run the bundled fake provider over HTTP for manual trials.",
    "serve": "Projector, recovery and reconciler in one process, with /metrics.",
    "replay": "Stream the log for audits (JSON lines or Avro) and verify histories.",
    "expire": "Remove settled effects older than a retention (archived first if asked).",
    "demo": "Simulated agent workload with crashes: effectlog against naive retries.",
    "mcp": "An MCP server in front of another, its side-effecting tools made effects.",
    "console-users": "The web console's people: named logins with hashed passwords.",
}


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:  # click would make it a quiet exit 1
            from effectlog.cli.context import OutputClosed

            raise OutputClosed() from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


#: Commands that run as services and log at INFO unless ``--log-level`` says otherwise.
SERVICES = frozenset({"serve"})


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log", "log_url", envvar="EFFECTLOG_LOG", show_envvar=True,
              default="sqlite:///./.effectlog/log.db", show_default=True,
              help="Event log URL: sqlite:///path, kafka://host:9092?prefix=effects, memory://")
@click.option("--state", "state_dir", envvar="EFFECTLOG_STATE", show_envvar=True,
              default="./.effectlog/state", show_default=True,
              help="Directory of the RocksDB projection.")
@click.option("--log-level", envvar="EFFECTLOG_LOG_LEVEL", show_envvar=True, default="WARNING",
              show_default=True, help="Logging level on stderr: DEBUG, INFO, WARNING, ERROR "
                                      "(serve: INFO unless given).")
@click.option("--log-json/--log-text", envvar="EFFECTLOG_LOG_JSON", show_envvar=True,
              default=False, help="Log one JSON object per line instead of text.")
@click.option("--timeout", "timeout_s", envvar="EFFECTLOG_TIMEOUT", show_envvar=True,
              type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True,
              metavar="SECONDS",
              help="How long a command waits for the log (a Kafka broker: sets the URL's "
                   "timeout_s) before it fails with exit 4; also bounds a read's catch-up.")
@click.version_option(package_name="effectlog")
@click.pass_context
def cli(ctx: click.Context, log_url: str, state_dir: str, log_level: str, log_json: bool,
        timeout_s: float) -> None:
    """effectlog: the truth about external side effects performed by workers.

    \b
    Shell completion, e.g. in ~/.bashrc (zsh: zsh_source; fish: fish_source):
      eval "$(_EFFECTLOG_COMPLETE=bash_source effectlog)"
    """
    from effectlog.logging_setup import configure_logging
    from effectlog.redact import register_url_secrets

    register_url_secrets(log_url)
    if ctx.invoked_subcommand in SERVICES and \
            ctx.get_parameter_source("log_level") is ParameterSource.DEFAULT:
        log_level = "INFO"  # a service says what it does: assignments, restores, recoveries
    try:
        configure_logging(log_level, json=log_json)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--log-level") from exc
    if logging.getLogger().level > logging.DEBUG:
        # librdkafka repeats connection failures many times a second; the command itself
        # reports the failure once, as a one-line error with exit code 4.
        logging.getLogger("effectlog.log.kafka.librdkafka").setLevel(logging.CRITICAL)
    if ctx.get_parameter_source("timeout_s") is not ParameterSource.DEFAULT:
        log_url = with_timeout(log_url, timeout_s)
    ctx.obj = CliContext.checked(log_url, state_dir, timeout_s)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point: run the CLI, map errors to exit codes, exit."""
    from effectlog.cli.context import run_guarded

    run_guarded(cli, argv)


if __name__ == "__main__":
    main()
