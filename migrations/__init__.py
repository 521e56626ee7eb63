"""outboxkit's tables: the Alembic scripts and the runner that applies them.

Version table ``alembic_version_outboxkit``, apart from a host application's own history.
"""

from outboxkit.migrations.runner import downgrade, upgrade

__all__ = ["downgrade", "upgrade"]
