"""The optional TOML config file (``--config`` or ``OUTBOXKIT_CONFIG``) as a settings source.

One precedence rule for every setting: a flag, then an ``OUTBOXKIT_*`` environment variable,
then the config file, then the default. The file has one table per settings class
(``[kafka]``, ``[database]``); a key the class does not know is an error, so a typo is not
silently ignored.
"""

from __future__ import annotations

import os
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from outboxkit.outbox.errors import OutboxError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

CONFIG_ENV = "OUTBOXKIT_CONFIG"
TABLES = ("database", "kafka")  # one per settings class; any other table is an error
_chosen: ContextVar[Path | None] = ContextVar("outboxkit_config_file", default=None)


class ConfigFileError(OutboxError):
    """The config file is missing, not TOML, or has a table of the wrong shape."""


def use_config_file(path: Path | None) -> None:
    """Read settings from ``path`` from now on (the ``--config`` flag); ``None``: the env's."""
    _chosen.set(path)


def config_path() -> Path | None:
    """The config file in use: the one chosen with ``--config``, else ``OUTBOXKIT_CONFIG``."""
    chosen = _chosen.get()
    if chosen is not None:
        return chosen
    named = os.environ.get(CONFIG_ENV, "").strip()
    return Path(named) if named else None


def config_table(name: str, path: Path | None = None) -> dict[str, Any]:
    """The ``[name]`` table of the config file (empty without a file or without the table)."""
    path = path if path is not None else config_path()
    if path is None:
        return {}
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigFileError(f"config file {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError(f"config file {path} is not valid TOML: {error}") from None
    unknown = sorted(set(document) - set(TABLES))
    if unknown:
        raise ConfigFileError(
            f"config file {path}: unknown table(s) {', '.join(f'[{t}]' for t in unknown)}: "
            f"the tables are {', '.join(f'[{t}]' for t in TABLES)}"
        )
    table = document.get(name, {})
    if not isinstance(table, dict):
        raise ConfigFileError(f"config file {path}: [{name}] must be a table")
    return table


class TomlTableSource(PydanticBaseSettingsSource):
    """Values of one table of the config file, for ``settings_customise_sources``."""

    def __init__(
        self, settings_cls: type[BaseSettings], table: str, keys: dict[str, str] | None = None
    ) -> None:
        super().__init__(settings_cls)
        self.table = table
        keys = keys or {}  # a key of the table -> the field it sets, where the names differ
        self._values = {keys.get(key, key): value for key, value in config_table(table).items()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """One field's value from the table (unused: :meth:`__call__` returns them all)."""
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        unknown = sorted(set(self._values) - set(self.settings_cls.model_fields))
        if unknown:
            raise ConfigFileError(
                f"config file {config_path()}: unknown key(s) in [{self.table}]: "
                + ", ".join(unknown)
            )
        return dict(self._values)
