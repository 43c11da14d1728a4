"""Closing an asynchronous ``distributed.Client`` so nothing of it is left on its loop.

The deployment and each resource manager hold a client to the scheduler on their own loop, and
close it before that loop stops. ``Client.close`` asks the scheduler to close the stream
(``close-stream``) and then skips its ``BatchedSend.close`` when the scheduler has closed the
comm first, which it usually has: the batched stream's background coroutine is then still
waiting on its waker, with a send interval's timeout pending while its last messages went out.
If the loop stops as that timeout fires, the timeout's future is dropped unread and the
interpreter prints ``Future exception was never retrieved ... TimeoutError('Timeout')``
(created in ``BatchedSend._background_send``) at exit. :func:`close_client` closes the batched
stream itself when the client left it running, and waits (bounded) for its coroutine to end.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger(__name__)


async def close_client(client, timeout: float) -> None:
    """Close ``client`` within ``timeout`` seconds, its batched stream to the scheduler too.

    A failure to close is logged at debug level, not raised: the caller is shutting down, and the
    scheduler may be gone already (a lost driver's cluster, a test's killed scheduler)."""
    try:
        await asyncio.wait_for(client.close(), timeout)
    except Exception as exc:
        logger.debug("closing the client failed: %s", exc)
    stream = getattr(client, "scheduler_comm", None)
    if stream is not None and not stream.please_stop:
        try:
            await asyncio.wait_for(stream.close(timeout=timeout), timeout)
        except Exception as exc:
            logger.debug("closing the client's batched stream failed: %s", exc)
