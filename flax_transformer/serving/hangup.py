"""A client that hangs up costs nothing: ASGI middleware that cancels a request's handler
when its client disconnects after sending its body.

uvicorn runs a handler to its end whoever still listens: a client that gave up (curl
-m 1, a browser tab closed, a proxy's timeout) left its request queued for a compile
and a search, ahead of live ones. Here, once the body has arrived, the connection is
watched; a disconnect cancels the handler's task, and with it the batcher futures it
awaits (asyncio.wrap_future cancels them), which the batcher then drops unsearched
and, if nobody else waits for it, uncompiled (batcher.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger("flax_transformer.serving")


class CancelOnDisconnect:
  """ASGI middleware: a request whose client disconnects once its body is in is cancelled
  (one log line); it answers nothing (nobody would read it)."""

  def __init__(self, app):
    self.app = app

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    body_in = asyncio.Event()

    async def tracked_receive():
      message = await receive()
      if message["type"] != "http.request" or not message.get("more_body", False):
        body_in.set()  # The whole body (or a disconnect): from now on, watch.
      return message

    handler = asyncio.ensure_future(self.app(scope, tracked_receive, send))
    watcher = asyncio.ensure_future(_hung_up(body_in, receive))
    try:
      await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # Our own cancellation (a shutdown) reaches the handler as before.
      watcher.cancel()
      if not handler.done() and not watcher.done():
        handler.cancel()
    if handler.done():
      return handler.result()
    handler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
      await handler
    client = scope.get("client") or ("?",)
    log.warning("%s %s from %s: client disconnected before its answer; cancelled",
                scope.get("method"), scope.get("path"), client[0])


async def _hung_up(body_in: asyncio.Event, receive) -> None:
  """Returns once the client has disconnected (its body received first)."""
  await body_in.wait()
  while (await receive())["type"] != "http.disconnect":
    pass
