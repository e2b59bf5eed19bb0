"""Progress: the step meter (loss, rates, MFU of the steps since the last log) and the
log line it makes, with the NaN policy applied as the steps' metrics are fetched."""

from __future__ import annotations

import logging
import math
import sys
import time

import jax
import numpy as np

from flax_transformer.checkpoints import Checkpointer
from flax_transformer.errors import NonFiniteLossError
from flax_transformer.training.metrics import previous_wall_time
from flax_transformer.training.steps import train_step_flops


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
      f"{seconds // 60}m{seconds % 60:02d}s"


def peak_memory() -> str:
  """Device memory where the backend reports it (GPU/TPU), else the host's peak RSS."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return f"device mem peak {stats['peak_bytes_in_use'] / 2**30:.1f} GB"
  rss = peak_rss_bytes()
  return f"peak RSS {rss / 2**30:.1f} GB" if rss else "peak RSS ?"


def peak_rss_bytes() -> int | None:
  """This process's peak resident memory, where the platform tells it (not Windows)."""
  try:
    import resource
  except ImportError:
    return None
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak if sys.platform == "darwin" else peak * 1024  # macOS: bytes; Linux: KiB.



class StepMeter:
  """Device metrics of the steps since the last log, fetched only when logged."""

  def __init__(self, config, step_flops: float, start_step: int, wall_before: float):
    self.config, self.step_flops, self.wall_before = config, step_flops, wall_before
    self.peak = config.peak_flops_per_device * jax.device_count()
    self.run_start = time.time()
    self.pending: list = []
    self.restart(start_step)

  def restart(self, step: int) -> None:
    """Step time counts from here (evaluation and saving are not step time)."""
    self.since_step, self.since = step, time.time()

  def add(self, step: int, metrics) -> None:
    self.pending.append((step, metrics))  # Fetching each would sync host and device.

  def wall_s(self) -> float:
    return self.wall_before + time.time() - self.run_start

  def summary(self, step: int, checkpointer: Checkpointer) -> dict[str, float]:
    """Means of the pending steps, rates, and the NaN policy applied to each."""
    fetched = jax.device_get([m for _, m in self.pending])
    for (s, _), m in zip(self.pending, fetched):
      if m["nonfinite"]:
        message = f"non-finite loss ({m['loss']}) at step {s}"
        if self.config.nan_policy == "stop":
          checkpointer.wait()
          raise NonFiniteLossError(message + ": stopping; the last checkpoint holds the "
                                   "parameters before it (set config.nan_policy='skip' to "
                                   "skip such steps instead)")
        logging.warning("%s: update skipped", message)
    elapsed = max(time.time() - self.since, 1e-9)
    steps = max(step - self.since_step, 1)
    summary = {k: float(np.mean([m[k] for m in fetched])) for k in
               ("loss", "nll", "learning_rate", "grad_norm")}
    summary.update(tokens_per_s=float(np.sum([m["tokens"] for m in fetched])) / elapsed,
                   step_time_s=elapsed / steps, wall_s=self.wall_s())
    if self.step_flops:
      summary["gflops_per_s"] = self.step_flops * steps / elapsed / 1e9
      if self.peak:
        summary["mfu"] = summary["gflops_per_s"] * 1e9 / self.peak
    self.pending = []
    return summary


def run_meter(config, model_config, global_rows: int, start_step: int, workdir) -> StepMeter:
  """A run's meter: analytic FLOPs per step (XLA's own count differs between backends:
  gflops_per_s and MFU in the log) and the wall time of earlier launches (process 0's
  only: the others need not read every metrics object of a bucket workdir)."""
  step_flops = train_step_flops(model_config, global_rows, config.max_source_length,
                                config.max_target_length)
  return StepMeter(config, step_flops, start_step,
                   previous_wall_time(workdir) if jax.process_index() == 0 else 0.0)


def log_line(config, step: int, summary: dict[str, float]) -> str:
  """The log step's line; the evaluations' parts where the summary holds them (a stop may
  cut one short)."""
  eta = (config.num_train_steps - step) * summary["step_time_s"]
  line = (f"step {step}/{config.num_train_steps} | loss {summary['loss']:.4f} | "
          f"lr {summary['learning_rate']:.2e} | {summary['tokens_per_s']:,.0f} tok/s | "
          f"{summary['step_time_s']:.3f} s/step | ETA {format_duration(eta)} | {peak_memory()}")
  if "mfu" in summary:
    line += f" | MFU {100 * summary['mfu']:.1f}%"
  if "eval_loss" in summary:
    line += (f" || eval loss {summary['eval_loss']:.4f} ppl {summary['eval_perplexity']:.2f}"
             f" acc {summary['eval_accuracy']:.3f}")
  if "bleu" in summary:
    line += f" BLEU {summary['bleu']:.2f} chrF {summary['chrf']:.2f}"
  if "test_bleu" in summary:
    line += (f" | {config.test_split} BLEU {summary['test_bleu']:.2f}"
             f" chrF {summary['test_chrf']:.2f}")
  return line


