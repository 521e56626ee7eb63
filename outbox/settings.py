"""Settings shared by every outboxkit process, read from flags, ``OUTBOXKIT_*`` variables or
the config file (Kafka's are in :mod:`outboxkit.outbox.kafka_settings`)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping

from outboxkit.outbox.config_file import CONFIG_ENV, TomlTableSource
from outboxkit.outbox.errors import OutboxError
from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class Settings(BaseSettings):
    """Connection settings; each field maps to an ``OUTBOXKIT_<NAME>`` environment variable
    and to a key of the config file's ``[database]`` table (``url`` for ``db_url``)."""

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_", extra="ignore")

    db_url: str = Field(
        default="sqlite:///outboxkit.db",
        description="SQLAlchemy URL of the database holding the outbox (sync or async driver).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments (flags) > environment > the config file's ``[database]`` table > defaults."""
        return (
            init_settings,
            env_settings,
            TomlTableSource(settings_cls, "database", {"url": "db_url"}),
        )


ENV_PREFIX = "OUTBOXKIT_"
# Variables read outside the settings models, each by one component.
OTHER_VARIABLES: dict[str, str] = {
    CONFIG_ENV: "the TOML config file (--config)",
    "OUTBOXKIT_CACHE": "folder of the test kit's caches (the Kafka jars)",
    "OUTBOXKIT_TEST_PG_URL": "PostgreSQL server the test kit makes throwaway databases on",
    "OUTBOXKIT_PG_PASSWORD": "password scripts/start-postgres.sh gives the postgres user",
    "OUTBOXKIT_CONSOLE_TOKENS": "the console's TOKEN ROLE NAME lines (outboxkit console)",
}
# Prefixes left to test suites and benches (their apps read them), never to a setting.
RESERVED_PREFIXES = ("OUTBOXKIT_TEST_", "OUTBOXKIT_BENCH_", "OUTBOXKIT_CHAOS_", "OUTBOXKIT_FUZZ_")


class UnknownVariableError(OutboxError):
    """An ``OUTBOXKIT_*`` environment variable that no setting reads (a typo, or a name from
    an older release): refused rather than silently ignored."""


def setting_variables() -> set[str]:
    """The ``OUTBOXKIT_*`` names of every field of the settings models."""
    from outboxkit.outbox.kafka_settings import KafkaSettings

    names: set[str] = set()
    for model in (Settings, KafkaSettings):
        prefix = str(model.model_config.get("env_prefix", ""))
        names.update(f"{prefix}{field}".upper() for field in model.model_fields)
    return names


def known_variables(extra: Iterable[str] = ()) -> set[str]:
    """Every ``OUTBOXKIT_*`` name something reads: the settings, :data:`OTHER_VARIABLES`, and
    ``extra`` (the CLI's own, such as ``OUTBOXKIT_WORKFLOW_APP``)."""
    return setting_variables() | set(OTHER_VARIABLES) | set(extra)


def refuse_unknown_environment(
    extra: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> None:
    """Raise :class:`UnknownVariableError` naming the first ``OUTBOXKIT_*`` variable of
    ``environ`` (default: the process's) that nothing reads, with the closest known name."""
    known = known_variables(extra)
    for name in sorted(os.environ if environ is None else environ):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        if name.startswith(RESERVED_PREFIXES):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise UnknownVariableError(f"environment variable {name} is not a setting{hint}")
