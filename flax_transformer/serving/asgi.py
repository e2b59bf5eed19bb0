"""ASGI plumbing the server's middlewares share."""

from __future__ import annotations


class TrackedSend:
  """An ASGI `send` that notes whether the response has started (its status and headers
  sent): from then on, an error can no longer be answered with a response of its own."""

  def __init__(self, send):
    self._send, self.started = send, False

  async def __call__(self, message) -> None:
    self.started = self.started or message["type"] == "http.response.start"
    await self._send(message)
