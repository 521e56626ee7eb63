"""The root command's own options (``--config``, ``--version``) and the checks that run before
every command: the environment holds no ``OUTBOXKIT_*`` variable that nothing reads."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import typer
from outboxkit.outbox.config_file import use_config_file
from outboxkit.outbox.settings import refuse_unknown_environment


def package_version() -> str:
    """The installed distribution's version, from the package metadata."""
    return version("outboxkit")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"outboxkit {package_version()}")
        raise typer.Exit()


def root_options(
    ctx: typer.Context,
    config: Path | None = typer.Option(  # noqa: B008 - typer reads the default
        None,
        "--config",
        help="TOML file with [kafka] and [database] tables [env: OUTBOXKIT_CONFIG]. "
        "A flag beats an OUTBOXKIT_* variable, which beats the file.",
    ),
    show_version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print outboxkit's version and exit.",
    ),
) -> None:
    """Transactional outbox, Kafka relay, inbox consumers and agent actions."""
    refuse_unknown_environment(cli_variables(ctx.find_root().command))
    if config is not None:
        use_config_file(config)


def cli_variables(root: Any) -> set[str]:
    """The environment variables the command line's own options read (``envvar=``)."""
    found: set[str] = set()
    pending = [root]
    while pending:
        command = pending.pop()
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            found.update([envvar] if isinstance(envvar, str) else envvar or ())
        pending.extend(getattr(command, "commands", {}).values())
    return found
