"""The files a command writes (``replay --out``, ``expire --archive``), checked as options:
a mistyped path is bad usage (exit 2) before anything is read or written."""

from __future__ import annotations

import os

import click


def output_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: ``-`` (stdout, where the option allows it), or a file in a directory
    that exists; None when the option was not given."""
    if value is None or (value == "-" and param.default == "-"):
        return value
    if not value.strip():
        hint = ", or - for stdout" if param.default == "-" else ""
        raise click.BadParameter(f"an empty file name: give a path{hint}", ctx, param)
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        why = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise click.BadParameter(f"{value}: {parent} {why}", ctx, param)
    return value
