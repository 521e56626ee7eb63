"""outboxkit's tables: the Alembic scripts and the runner that applies them.

Version table ``alembic_version_outboxkit``, apart from a host application's own history;
a host's Alembic ``env.py`` passes :func:`include_object` so its autogenerate leaves outboxkit's
:data:`TABLES` alone.
"""

from outboxkit.migrations.host import TABLES, include_object
from outboxkit.migrations.runner import downgrade, upgrade

__all__ = ["TABLES", "downgrade", "include_object", "upgrade"]
