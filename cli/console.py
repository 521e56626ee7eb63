"""``outboxkit console``: serve the operator console (extra ``console``) until Ctrl-C.

It binds 127.0.0.1 unless told otherwise, and lets no one in without a token (``--tokens-file``
or ``OUTBOXKIT_CONSOLE_TOKENS``: ``TOKEN ROLE NAME`` lines) unless ``--insecure-no-auth``,
which only a loopback address accepts. Behind a reverse proxy, ``--proxy-header`` names the
header that carries the user, believed only from ``--trusted-proxy`` addresses, with the role
from ``--proxy-role-header`` or ``--proxy-users``. A token line or a users line ending in
``tenants=a,b`` limits that principal to those tenants. Workflow decisions go through
``--app MODULE:ENGINE`` (as ``outboxkit workflows resume``); without it the workflow pages only
read.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from outboxkit.cli.errors import CliError
from outboxkit.cli.options import (
    BootstrapOption,
    DbUrlOption,
    SaslMechanismOption,
    SaslUsernameOption,
    SecurityProtocolOption,
    SslCafileOption,
    SslCertfileOption,
    SslKeyfileOption,
    TimeoutOption,
    kafka_from,
    settings_from,
)
from outboxkit.cli.status import DlqTopicsOption, GroupsOption
from outboxkit.ops.access import quiet_kafka_logs

DEFAULT_PORT = 8470
TOKENS_VARIABLE = "OUTBOXKIT_CONSOLE_TOKENS"


def console(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535, help="Port to serve on."),
    tokens_file: Path | None = typer.Option(  # noqa: B008 - typer reads the default
        None,
        "--tokens-file",
        help=f"Lines TOKEN ROLE NAME (ROLE viewer or operator) [env: {TOKENS_VARIABLE}, the same "
        "lines separated by ';'].",
    ),
    insecure_no_auth: bool = typer.Option(
        False, "--insecure-no-auth", help="Let anyone in as an operator (loopback only)."
    ),
    proxy_header: str | None = typer.Option(
        None, "--proxy-header", help="Header a trusted reverse proxy names the user in."
    ),
    proxy_role_header: str | None = typer.Option(
        None, "--proxy-role-header", help="Header the proxy gives the role in (viewer|operator)."
    ),
    proxy_users: Path | None = typer.Option(  # noqa: B008 - typer reads the default
        None, "--proxy-users", help="Lines USER ROLE [tenants=a,b] for proxy-named users."
    ),
    trusted_proxies: list[str] | None = typer.Option(  # noqa: B008 - typer reads the default
        None,
        "--trusted-proxy",
        help="Address or CIDR the proxy header is believed from (repeatable).",
    ),
    app: str | None = typer.Option(
        None,
        "--app",
        envvar="OUTBOXKIT_WORKFLOW_APP",
        metavar="MODULE:ENGINE",
        help="The application's WorkflowEngine (or a function of the sessions), for resume, "
        "cancel and escalate.",
    ),
    actions_topic: str | None = typer.Option(
        None, "--actions-topic", envvar="OUTBOXKIT_ACTIONS_TOPIC", help="Topic of resolutions."
    ),
    refresh: float = typer.Option(5.0, "--refresh", min=0.5, help="Overview refresh (s)."),
    dlq_sample: int | None = typer.Option(
        None, "--dlq-sample", min=1, help="A dead-letter topic page groups its newest N (1000)."
    ),
    secure_cookies: bool = typer.Option(
        False, "--secure-cookies", help="Mark cookies Secure (behind an HTTPS reverse proxy)."
    ),
    groups: list[str] | None = GroupsOption,
    dlq_topics: list[str] | None = DlqTopicsOption,
    db_url: str | None = DbUrlOption,
    bootstrap: str | None = BootstrapOption,
    security_protocol: str | None = SecurityProtocolOption,
    sasl_mechanism: str | None = SaslMechanismOption,
    sasl_username: str | None = SaslUsernameOption,
    ssl_cafile: Path | None = SslCafileOption,
    ssl_certfile: Path | None = SslCertfileOption,
    ssl_keyfile: Path | None = SslKeyfileOption,
    timeout: float = TimeoutOption,
) -> None:
    """Serve the operator console in the browser until Ctrl-C."""
    try:
        import uvicorn
        from outboxkit.console import ConsoleConfig, Tokens, create_app
        from outboxkit.console.security import ProxyIdentity, is_loopback
    except ImportError as error:
        raise CliError(
            f"the console needs the 'console' extra (pip install 'outboxkit[console]'): {error}"
        ) from None
    from outboxkit.actions.events import DEFAULT_TOPIC

    tokens = Tokens.load(tokens_file, os.environ.get(TOKENS_VARIABLE))
    proxy = None
    if proxy_header is not None:
        proxy = ProxyIdentity(
            header=proxy_header,
            trusted=ProxyIdentity.networks(trusted_proxies or ()),
            role_header=proxy_role_header,
            users=ProxyIdentity.load_users(proxy_users) if proxy_users is not None else {},
        )
    elif proxy_role_header or proxy_users or trusted_proxies:
        raise CliError("--proxy-role-header, --proxy-users and --trusted-proxy need --proxy-header")
    if insecure_no_auth and not is_loopback(host):
        raise CliError(f"--insecure-no-auth serves a loopback address only, not {host}")
    if not insecure_no_auth and not tokens.by_digest and proxy is None:
        raise CliError(
            f"no tokens: give --tokens-file or {TOKENS_VARIABLE}, or --proxy-header (or "
            "--insecure-no-auth on loopback)"
        )
    settings = settings_from(db_url)
    kafka = kafka_from(
        bootstrap,
        security_protocol,
        sasl_mechanism,
        sasl_username,
        ssl_cafile,
        ssl_certfile,
        ssl_keyfile,
    )
    engine_factory = None
    if app is not None:
        from outboxkit.cli.workflows import load_engine

        target = app
        engine_factory = lambda: load_engine(target, db_url)  # noqa: E731
    config = ConsoleConfig(
        db_url=settings.db_url,
        kafka=kafka,
        tokens=tokens,
        proxy=proxy,
        insecure_no_auth=insecure_no_auth,
        dlq_topics=tuple(dlq_topics or ()),
        groups=tuple(groups or ()),
        timeout=timeout,
        actions_topic=actions_topic or DEFAULT_TOPIC,
        workflow_engine=engine_factory,
        refresh_s=refresh,
        **({} if dlq_sample is None else {"dlq_sample": dlq_sample}),
        secure_cookies=secure_cookies,
    )
    quiet_kafka_logs()
    typer.echo(f"outboxkit console on http://{host}:{port}/", err=True)
    uvicorn.run(create_app(config), host=host, port=port, access_log=False, log_level="warning")
