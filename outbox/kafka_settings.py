"""How every outboxkit component connects to Kafka: one settings model, one mapping to aiokafka.

The relay, the consumer runtime and its dead-letter producer, the operator commands and the
test kit all build their aiokafka clients from :class:`KafkaSettings`. Values come from the
caller (a flag), then ``OUTBOXKIT_KAFKA_*`` environment variables, then the ``[kafka]`` table of
the config file (:mod:`outboxkit.outbox.config_file`), then the defaults. Passwords, key
passphrases and tokens are :class:`~pydantic.SecretStr`: they print as ``**********`` and reach
aiokafka only.
"""

from __future__ import annotations

import importlib
import ssl
from pathlib import Path
from typing import Any, Literal

from outboxkit.outbox.config_file import TomlTableSource
from outboxkit.outbox.errors import OutboxError
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
_PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaSettingsError(OutboxError):
    """The Kafka settings are incomplete or contradict each other; one line says which."""


class KafkaSettings(BaseSettings):
    """Where the brokers are and how to authenticate to them (TLS, mTLS, SASL).

    Each field maps to ``OUTBOXKIT_KAFKA_<NAME>`` (``OUTBOXKIT_KAFKA_SASL_PASSWORD``...) and
    to ``<name>`` in the ``[kafka]`` table of the config file. :meth:`client_options` gives
    the keyword arguments of any aiokafka client (producer, consumer, admin).
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOXKIT_KAFKA_", extra="forbid")

    bootstrap: str = Field(
        default="127.0.0.1:9092", description="Kafka bootstrap servers, comma separated."
    )
    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."
    )
    sasl_username: str | None = Field(default=None, description="SASL user (PLAIN, SCRAM).")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password.")
    sasl_oauth_token_provider: str | None = Field(
        default=None,
        description=(
            "Import path (module:name) of an aiokafka AbstractTokenProvider: an instance, "
            "a class, or a function returning one (OAUTHBEARER)."
        ),
    )
    ssl_cafile: Path | None = Field(
        default=None, description="CA certificates (PEM) to trust; default: the system's."
    )
    ssl_certfile: Path | None = Field(default=None, description="Client certificate (PEM), mTLS.")
    ssl_keyfile: Path | None = Field(default=None, description="Client private key (PEM), mTLS.")
    ssl_key_password: SecretStr | None = Field(
        default=None, description="Passphrase of an encrypted client key."
    )
    ssl_check_hostname: bool = Field(
        default=True, description="Check that the broker's certificate names the host."
    )
    client_id: str | None = Field(
        default=None, description="Kafka client id of every client (default: one per role)."
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
        """Arguments (flags) > environment > the config file's ``[kafka]`` table > defaults."""
        return init_settings, env_settings, TomlTableSource(settings_cls, "kafka")

    @classmethod
    def load(cls, **given: Any) -> KafkaSettings:
        """Settings from ``given`` (``None`` values are left out), the environment and the
        config file; a problem is one :class:`KafkaSettingsError` line, never a value."""
        try:
            return cls(**{name: value for name, value in given.items() if value is not None})
        except ValidationError as error:
            raise KafkaSettingsError(validation_line(error)) from None

    @field_validator("security_protocol", mode="before")
    @classmethod
    def _protocol_spelling(cls, value: object) -> object:
        return value.strip().upper().replace("-", "_") if isinstance(value, str) else value

    @field_validator("sasl_mechanism", mode="before")
    @classmethod
    def _mechanism_spelling(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip().upper().replace("_", "-") or None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(
                f"sasl_mechanism is set but security_protocol is {self.security_protocol}: "
                "use SASL_SSL (or SASL_PLAINTEXT)"
            )
        if self.sasl_mechanism in _PASSWORD_MECHANISMS and (
            not self.sasl_username or self.sasl_password is None
        ):
            raise ValueError(f"SASL {self.sasl_mechanism} needs sasl_username and sasl_password")
        if self.sasl_mechanism == "OAUTHBEARER" and not self.sasl_oauth_token_provider:
            raise ValueError("SASL OAUTHBEARER needs sasl_oauth_token_provider")
        files = [self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile, self.ssl_key_password]
        if not tls and any(value is not None for value in files):
            raise ValueError(
                f"TLS files are set but security_protocol is {self.security_protocol}: "
                "use SSL or SASL_SSL"
            )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile is set without ssl_certfile")
        return self

    @property
    def uses_tls(self) -> bool:
        """True for SSL and SASL_SSL."""
        return self.security_protocol.endswith("SSL")

    def secrets(self) -> list[str]:
        """The secret values, for masking any text that might echo one."""
        values = [self.sasl_password, self.ssl_key_password]
        return [value.get_secret_value() for value in values if value is not None]

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the CA file (or the system's CAs), the client certificate
        and key for mTLS, hostname checking unless turned off."""
        try:
            context = ssl.create_default_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None
            )
        except (OSError, ssl.SSLError) as error:
            raise KafkaSettingsError(f"ssl_cafile {self.ssl_cafile}: {_reason(error)}") from None
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile is not None:
            # Always a passphrase (empty when unset): with None, OpenSSL would stop to prompt
            # for one on a terminal; an encrypted key without one is an error instead.
            secret = self.ssl_key_password
            passphrase = secret.get_secret_value() if secret is not None else ""
            try:
                context.load_cert_chain(
                    str(self.ssl_certfile),
                    str(self.ssl_keyfile) if self.ssl_keyfile else None,
                    lambda: passphrase,
                )
            except (OSError, ssl.SSLError) as error:
                raise KafkaSettingsError(
                    f"ssl_certfile {self.ssl_certfile} / ssl_keyfile {self.ssl_keyfile}: "
                    f"{_reason(error)} (a wrong or missing ssl_key_password?)"
                ) from None
        return context

    def client_options(self, client_id: str) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaProducer``, ``AIOKafkaConsumer``,
        ``AIOKafkaAdminClient`` or ``AIOKafkaClient``; ``client_id`` is the role's default
        id, replaced by :attr:`client_id` when set."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
            "client_id": self.client_id or client_id,
        }
        if self.uses_tls:
            options["ssl_context"] = self.ssl_context()
        if self.sasl_mechanism is not None:
            options["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_mechanism in _PASSWORD_MECHANISMS:
            assert self.sasl_password is not None
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        if self.sasl_mechanism == "OAUTHBEARER":
            assert self.sasl_oauth_token_provider is not None
            options["sasl_oauth_token_provider"] = token_provider(self.sasl_oauth_token_provider)
        return options

    def describe(self) -> dict[str, str]:
        """The settings an operator may see (no secret), for logs and ``status``."""
        shown = {"bootstrap": self.bootstrap, "security_protocol": self.security_protocol}
        if self.sasl_mechanism is not None:
            shown["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            shown["sasl_username"] = self.sasl_username
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, name)
            if value is not None:
                shown[name] = str(value)
        return shown


def token_provider(path: str) -> Any:
    """The aiokafka ``AbstractTokenProvider`` named by ``module:name`` (or ``module.name``):
    an instance as is, a class or a factory function called without arguments."""
    from aiokafka.abc import AbstractTokenProvider

    module_name, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise KafkaSettingsError(f"sasl_oauth_token_provider {path!r}: {error}") from None
    provider = found if isinstance(found, AbstractTokenProvider) else found()
    if not isinstance(provider, AbstractTokenProvider):
        raise KafkaSettingsError(
            f"sasl_oauth_token_provider {path!r} is not an aiokafka AbstractTokenProvider"
        )
    return provider


def validation_line(error: ValidationError) -> str:
    """A pydantic error as one line: field names and reasons, never the input values."""
    parts = []
    for problem in error.errors(include_input=False, include_url=False):
        where = ".".join(str(part) for part in problem["loc"])
        reason = str(problem["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {reason}" if where else reason)
    return "kafka settings: " + "; ".join(parts)


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror and not isinstance(error, ssl.SSLError):
        return error.strerror
    return getattr(error, "reason", None) or str(error) or type(error).__name__
