"""serve.py's shutdown: on SIGTERM (or Ctrl-C) the requests in flight are answered for up
to a drain time while new ones get a one-line JSON 503; then uvicorn stops.

uvicorn alone stops listening at once (a new client meets a refused connection) and
cancels what is left after its graceful timeout: a cancelled handler answered a
plain-text 500 and logged a traceback (CancelledError is no Exception). Here a handler
cut off at the drain's end answers a JSON 503, and one log line counts what the drain
answered, refused and cut off. A second signal ends the drain at once. serve.py exits 0
after a drain that answered every request in flight; one that cut some off, or a second
signal, ends it by the signal (143 for SIGTERM, as uvicorn alone).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import uvicorn
from fastapi.responses import JSONResponse

from flax_transformer.serving.asgi import TrackedSend

log = logging.getLogger("flax_transformer.serving")

REFUSED = "the server is shutting down: send this request to another server, or again later"
CUT_OFF = "the server shut down before this request was answered (serve.py --drain_s)"


class Drain:
  """The drain (a shutdown that first answers the requests in flight): those requests, and,
  once a shutdown began, what became of them and of new ones."""

  def __init__(self):
    self.in_flight = 0
    self.deadline: float | None = None  # time.monotonic() the drain ends at; None: serving.
    self.seconds = 0.0
    self.signal = ""
    self.at_start = self.drained = self.refused = self.cut = 0

  @property
  def draining(self) -> bool:
    return self.deadline is not None

  def start(self, seconds: float, signal_name: str) -> None:
    self.deadline, self.seconds, self.signal = time.monotonic() + seconds, seconds, signal_name
    self.at_start = self.in_flight
    log.info("%s: answering the %d request(s) in flight for up to %g s (--drain_s); new "
             "ones get 503", signal_name, self.in_flight, seconds)

  def over(self) -> bool:
    return self.draining and (self.in_flight == 0 or time.monotonic() >= self.deadline)

  def summary(self) -> str:
    return (f"Shut down on {self.signal}: drained {self.drained} of the {self.at_start} "
            f"request(s) in flight, refused {self.refused} new one(s) with 503, cut off "
            f"{self.cut} at the {self.seconds:g} s drain time")


class Gate:
  """The gate every HTTP request passes (ASGI middleware), counting those in flight for
  `drain`: while it drains, a new request gets a JSON 503, and one whose handler is
  cancelled gets one too."""

  def __init__(self, app, drain: Drain):
    self.app, self.drain = app, drain

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    drain = self.drain
    if drain.draining:
      drain.refused += 1
      return await _answer_503(REFUSED, scope, receive, send)
    tracked = TrackedSend(send)
    drain.in_flight += 1
    try:
      await self.app(scope, receive, tracked)
      drain.drained += drain.draining
    except asyncio.CancelledError:  # uvicorn's shutdown, at the drain's end.
      drain.cut += 1
      if not tracked.started:
        await _answer_503(CUT_OFF, scope, receive, send)
    finally:
      drain.in_flight -= 1


async def _answer_503(message: str, scope, receive, send) -> None:
  try:
    await JSONResponse({"error": message}, status_code=503, headers={"Connection": "close"})(
        scope, receive, send)
  except OSError:  # The client has gone: nobody to answer.
    pass


class DrainingServer(uvicorn.Server):
  """uvicorn.Server whose first SIGTERM/SIGINT drains `drain` for `drain_s` seconds before
  uvicorn's own shutdown, which then cancels what is left within a second."""

  def __init__(self, config: uvicorn.Config, drain: Drain, drain_s: float):
    super().__init__(config)
    self.drain, self.drain_s = drain, drain_s

  def handle_exit(self, sig: int, frame) -> None:
    if self.drain.draining:  # A second signal: stop now.
      self.drain.deadline = time.monotonic()
      return super().handle_exit(sig, frame)
    # Not uvicorn's _captured_signals, which it raises again once stopped (exit 143 after
    # a clean drain): shutdown() records it only if the drain cut requests off.
    self.sig = sig
    self.drain.start(self.drain_s, signal.Signals(sig).name)

  async def on_tick(self, counter: int) -> bool:
    if self.drain.over():
      self.should_exit = True
    return await super().on_tick(counter)

  async def shutdown(self, sockets=None) -> None:
    await super().shutdown(sockets)
    await asyncio.sleep(0.1)  # The cancelled handlers answer their 503s.
    log.info("%s", self.drain.summary())
    if self.drain.cut:  # Not clean: the process ends by its signal (143 for SIGTERM).
      self._captured_signals.append(self.sig)


def run(app, sockets, drain: Drain, drain_s: float) -> None:
  """Serves `app` (made with `drain`) on `sockets` until a signal and its drain."""
  config = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=1)
  DrainingServer(config, drain, drain_s).run(sockets=sockets)
