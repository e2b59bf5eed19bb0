"""A signal (SIGTERM, SIGINT) turned into a clean stop: the loop saves, then exits."""

from __future__ import annotations

import logging
import os
import signal
import sys

import jax

from flax_transformer.checkpoints import Checkpointer
from flax_transformer.errors import EXIT_FORCED


class StopRequest:
  """SIGTERM / SIGINT ask the loop to checkpoint and exit cleanly (exit status 0).

  One process: a handler notes the signal and the loop stops after the step it
  is in. Several: all must stop after the same step, so SIGTERM is left to
  jax.distributed's preemption service (its own handler spreads the notice to
  every process, and `Checkpointer.reached_preemption(step)` turns true on all of
  them at the same step), and SIGINT is passed on to it as a SIGTERM.

  A second signal (`again`): a SIGTERM is logged and ignored (a launcher that forwards
  the signal it also received sends it twice, and the save the first asked for must
  finish: interrupting it left a KeyboardInterrupt inside orbax and the checkpoint as
  N.orbax-checkpoint-tmp); a SIGINT (Ctrl-C again) ends the process at once, in one
  line, without waiting for a save in progress: the complete checkpoints are intact
  (orbax renames a step into place only once it is whole) and the next launch resumes
  from the newest, removing the partial one.
  """

  def __init__(self, checkpointer: Checkpointer):
    self.checkpointer = checkpointer
    self.several = jax.process_count() > 1
    self.signal_name = None  # Why the loop stops, once it is decided.
    self.received = None  # The signal this process got (several processes: not yet agreed).

  def install(self, start_step: int) -> None:
    self.previous = {}  # The handlers `uninstall` puts back.
    for sig in (signal.SIGINT,) if self.several else (signal.SIGTERM, signal.SIGINT):
      self.previous[sig] = signal.signal(sig, self._handle)
    if self.several:
      # The sync point is one past the furthest step any process reported: report the
      # start, or a notice before the first step would name a step this run never sees.
      self.requested(start_step)

  def uninstall(self) -> None:
    for sig, handler in self.previous.items():
      signal.signal(sig, handler)

  def _handle(self, signum, frame):
    if self.received is not None:
      self.again(signal.Signals(signum).name)
      return
    self.received = signal.Signals(signum).name
    if self.several:
      logging.warning("%s received: asking every process to stop at one step and save",
                      self.received)
      os.kill(os.getpid(), signal.SIGTERM)  # To the preemption service's handler.
      return
    self.signal_name = self.received
    logging.warning("%s received: saving a checkpoint, then exiting", self.signal_name)

  def again(self, name: str) -> None:
    """A signal after the first: SIGINT exits now (EXIT_FORCED), any other is ignored."""
    if name != "SIGINT":
      logging.warning("%s again: ignored, the stop asked for goes on (its checkpoint is saved, "
                      "then the process exits); a second SIGINT (Ctrl-C) exits at once", name)
      return
    sys.stderr.write(f"\nerror: SIGINT again: exiting at once, without waiting for a checkpoint "
                     f"being saved; the complete ones in {self.checkpointer.directory} are "
                     "intact, and the next launch resumes from the newest\n")
    sys.stderr.flush()
    os._exit(EXIT_FORCED)  # noqa: SLF001  Not SystemExit: orbax's waits would finish the save.

  def requested(self, step: int) -> bool:
    """Whether the loop stops after `step` (1-based; several processes: call it at
    every step, the same on all)."""
    if self.several and self.signal_name is None and self.checkpointer.reached_preemption(step):
      self.signal_name = self.received or "SIGTERM"
      logging.warning("Preemption notice (%s) reached every process: saving step %d, then "
                      "exiting", self.signal_name, step)
    return self.signal_name is not None

  def arrived(self) -> bool:
    """Whether a signal asks this process to stop now, for work that may end early
    between its own pieces (an evaluation's batches). One process only: several must
    stop at the same point, agreed at a step (`requested`), so for them it stays False."""
    return not self.several and self.signal_name is not None
