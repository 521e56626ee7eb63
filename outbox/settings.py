"""Settings shared by every outboxkit process, read from flags or ``OUTBOXKIT_*`` variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Connection settings; each field maps to an ``OUTBOXKIT_<NAME>`` environment variable."""

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_", extra="ignore")

    db_url: str = Field(
        default="sqlite:///outboxkit.db",
        description="SQLAlchemy URL of the database holding the outbox (sync or async driver).",
    )
    kafka_bootstrap: str = Field(
        default="127.0.0.1:9092", description="Kafka bootstrap servers, comma separated."
    )
