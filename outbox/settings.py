"""Settings shared by every outboxkit process, read from flags, ``OUTBOXKIT_*`` variables or
the config file (Kafka's are in :mod:`outboxkit.outbox.kafka_settings`)."""

from __future__ import annotations

from outboxkit.outbox.config_file import TomlTableSource
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
