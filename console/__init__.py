"""``outboxkit console``: the operator console in the browser (extra ``console``).

Server-rendered pages on Starlette that read and act through the same :mod:`outboxkit.ops`
functions as the CLI; see ``docs/console.md``. Build the app with :func:`create_app`.
"""

from outboxkit.console.app import create_app
from outboxkit.console.context import ConsoleConfig
from outboxkit.console.security import Principal, Tokens

__all__ = ["ConsoleConfig", "Principal", "Tokens", "create_app"]
