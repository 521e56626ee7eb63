"""The ``outboxkit`` command line: the root app composes one sub-app or command per concern.

Nothing imports this module; it imports the command modules. Errors an operator can fix end in
one line on stderr and exit code 2 (the table is in :mod:`outboxkit.cli.errors`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from outboxkit.cli import signals

if TYPE_CHECKING:
    import typer

# Commands that run until stopped: they take over SIGTERM and SIGINT themselves (a stop is a
# clean exit 0). Every other command keeps the default handlers.
LONG_RUNNING = frozenset({"relay", "consume", "dev", "workflows run"})


def build_app() -> typer.Typer:
    """The root app with every command and sub-app (imported here: this is the slow part)."""
    import typer
    from outboxkit.cli.actions import actions_app
    from outboxkit.cli.console import console
    from outboxkit.cli.consume import consume
    from outboxkit.cli.dev import dev_app
    from outboxkit.cli.dlq import dlq_app
    from outboxkit.cli.examples import add_examples
    from outboxkit.cli.idempotency import idempotency_app
    from outboxkit.cli.migrate import migrate
    from outboxkit.cli.outbox import outbox_app
    from outboxkit.cli.relay import relay
    from outboxkit.cli.root import root_options
    from outboxkit.cli.status import status
    from outboxkit.cli.workflows import workflows_app

    app = typer.Typer(
        name="outboxkit",
        help="Transactional outbox, Kafka relay, inbox consumers and agent actions.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        add_completion=True,
    )

    app.callback()(root_options)
    app.command()(migrate)
    app.command()(relay)
    app.command()(consume)
    app.command()(status)
    app.command()(console)
    app.add_typer(outbox_app, name="outbox")
    app.add_typer(dlq_app, name="dlq")
    app.add_typer(actions_app, name="actions")
    app.add_typer(idempotency_app, name="idempotency")
    app.add_typer(dev_app, name="dev")
    app.add_typer(workflows_app, name="workflows")
    add_examples(app)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # ``outboxkit.cli.main.app``, built on first use
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with a code from the table in :mod:`outboxkit.cli.errors`.

    SIGTERM and SIGINT are held first thing (:mod:`outboxkit.cli.signals`), before the
    commands are imported.
    """
    signals.hold()
    args = sys.argv[1:] if argv is None else list(argv)
    run_app(build_app(), args, keep_signals_held=_is_long_running(args))


def _is_long_running(args: list[str]) -> bool:
    """True for a command in :data:`LONG_RUNNING`, or a sub-command there (``workflows run``)."""
    words = _words(args)
    return bool(words) and (words[0] in LONG_RUNNING or " ".join(words[:2]) in LONG_RUNNING)


def _words(args: list[str]) -> list[str]:
    """The command and sub-command named in ``args``, past the root options (``--config F``)."""
    found: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--config" and not found:
            next(rest, None)
        elif arg.startswith("-"):
            if found:
                break  # the command's own options: a sub-command comes before them
        else:
            found.append(arg)
            if len(found) == 2:
                break
    return found


def run_app(app: typer.Typer, args: list[str], *, keep_signals_held: bool = False) -> None:
    """Run ``app`` on ``args`` and exit with a code from :mod:`outboxkit.cli.errors`: an error
    an operator can fix is one line (2), Ctrl-C is 130, anything unexpected a traceback (70).

    Unless ``keep_signals_held`` (a long-running command takes them over), SIGTERM and SIGINT
    get their default handlers back first.
    """
    import traceback

    import typer
    from outboxkit.cli.errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, error_line

    try:
        if not keep_signals_held:
            signals.release()  # a SIGINT recorded meanwhile is raised here: exit 130
        result = app(args=args, standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(EXIT_INTERRUPTED)
    except Exception as error:
        message = error_line(error)
        if message is None:
            traceback.print_exc()
            sys.exit(EXIT_BUG)
        print(f"outboxkit: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if isinstance(result, int):
        sys.exit(result)
