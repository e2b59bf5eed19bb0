"""The cadence (how often, in steps, each periodic job runs): which periodic work (log,
evaluation, BLEU, checkpoint) follows a step."""

from __future__ import annotations

import dataclasses

from flax_transformer import collectives


@dataclasses.dataclass(frozen=True)
class WorkDue:
  """The periodic work that follows one step."""

  log: bool = False
  eval: bool = False
  bleu: bool = False
  test_bleu: bool = False
  save: bool = False

  def any(self) -> bool:
    return any(dataclasses.astuple(self))


def work_due_after(config, step: int, stopping: bool = False,
                   seconds_since_save: float = 0.0) -> WorkDue:
  """What step `step` (1-based) is followed by: each cadence, the last step, a signal.

  `stopping` (a signal: a preemption notice of ~30 s) logs and saves, and drops the
  evaluations: a BLEU decode can take minutes, and the save must not wait for it.
  `checkpoint_every_minutes` (the paper saved every 10 minutes) is checked at log
  steps only: in a multi-process run every process must take the same decision,
  and process 0's clock is broadcast to the others there, not at every step.
  """
  last = step == config.num_train_steps

  def every(n: int) -> bool:  # n = 0: never (BLEU cadences), except at the last step.
    return n > 0 and (step % n == 0 or last)

  log = every(config.log_every_steps)
  minutes = config.checkpoint_every_minutes
  by_time = minutes > 0 and log and collectives.broadcast_from_process0(
      seconds_since_save >= 60 * minutes)
  evaluate = not stopping
  return WorkDue(log=log or stopping,
                 eval=evaluate and every(config.eval_every_steps),
                 bleu=evaluate and every(config.bleu_every_steps),
                 test_bleu=evaluate and every(config.test_bleu_every_steps),
                 save=every(config.checkpoint_every_steps) or by_time or stopping)
