"""The FastAPI dependency form: a route opts in to ``Idempotency-Key`` by declaring it.

```python
from outboxkit.idempotency.depends import IdempotentSession

@app.post("/refunds", status_code=201)
async def create(body: RefundIn, session: IdempotentSession) -> RefundOut: ...
```

The app still needs :class:`~outboxkit.idempotency.middleware.IdempotencyMiddleware` (it
buffers and stores the response); ``routes`` may then stay empty. The dependency claims the key
before the handler runs (400/409/422 or the replay are sent instead of running it) and gives
the handler the session whose transaction also completes the key. ``Idempotent`` opts in
without a session (the response is stored in a transaction of its own).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from outboxkit.idempotency.context import IdempotencyContext, context_of
from sqlalchemy.ext.asyncio import AsyncSession


async def require_idempotency(request: Request) -> IdempotencyContext:
    """Claim the request's key (or stop the request with the middleware's answer)."""
    context = context_of(request.scope)
    await context.claim_or_raise(await request.body())
    return context


async def idempotent_session(request: Request) -> AsyncSession:
    """Claim the key and return the session of the request's one transaction."""
    context = await require_idempotency(request)
    return await context.session()


Idempotent = Annotated[IdempotencyContext, Depends(require_idempotency)]
IdempotentSession = Annotated[AsyncSession, Depends(idempotent_session)]
