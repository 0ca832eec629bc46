"""``effectlog console-users add NAME --file FILE``: a person who may decide in the console.

The password is asked twice on a terminal (or read from stdin with ``--password-stdin``, for
scripts) and only its scrypt hash is written (:mod:`consumers.console.users`); ``serve
--console-users FILE`` then lets that person log in and records their decisions under NAME.
"""

from __future__ import annotations

import sys

import click

from effectlog.cli.context import EXIT_USAGE, fail


@click.group(name="console-users")
def console_users() -> None:
    """The web console's people (serve --console-users FILE)."""


@console_users.command("add")
@click.argument("name")
@click.option("--file", "path", required=True, metavar="FILE", envvar="EFFECTLOG_CONSOLE_USERS",
              help="The users file (created 0600; env EFFECTLOG_CONSOLE_USERS).")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of stdin instead of asking.")
def add(name: str, path: str, password_stdin: bool) -> None:
    """Add NAME (or give NAME a new password) in FILE; only a hash of the password is kept."""
    from consumers.console.users import add_user, check_name

    check_name(name)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif sys.stdin.isatty():
        password = click.prompt(f"password for {name}", hide_input=True,
                                confirmation_prompt=True)
    else:
        fail("no terminal to ask the password on: pass --password-stdin", EXIT_USAGE)
    replaced = add_user(path, name, password)
    click.echo(f"{'updated' if replaced else 'added'} {name} in {path}")
