"""The training loop: data in, sharded steps, evaluation, checkpoints, metrics out.

`train_and_evaluate(config, workdir)` is everything `train.py` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
import sacrebleu

from flax_transformer import compilation, launch_lock, provenance, storage
from flax_transformer.data import pipeline as data_lib
from flax_transformer.data.sources import load_pairs, prepare as prepare_data
from flax_transformer.errors import CheckpointSaveError, ConfigError, NonFiniteLossError
from flax_transformer.network.config import TransformerConfig
from flax_transformer.training import distributed, host_allocator
from flax_transformer.training import sharding as sharding_lib
from flax_transformer import workdir as workdir_lib
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.training.metrics import create_writer, previous_wall_time
from flax_transformer.training.steps import (CROSS_ENTROPY_BACKWARDS, Trainer, evaluate,
                                             train_step_flops)
from flax_transformer.translation import batching
from flax_transformer.translation.translator import (SearchConfig, batch_keys, make_search_fn,
                                                     per_shape, search_batches, translate_ids)

def model_config_from(config) -> TransformerConfig:
  try:
    return TransformerConfig.from_dict(config.model.to_dict())
  except ValueError as e:
    raise ConfigError(f"config.model: {e}") from None


PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def check_config(config) -> None:
  """Rejects settings that cannot work before anything expensive starts."""
  positive = ("num_train_steps", "warmup_steps", "batch_tokens", "max_source_length",
              "max_target_length", "grad_accum_steps", "log_every_steps",
              "checkpoint_every_steps", "eval_every_steps", "eval_batch_tokens", "beam_size",
              "eval_max_shapes")
  for key in positive:
    if config[key] <= 0:
      raise ConfigError(f"config.{key} must be positive, got {config[key]}")
  if config.prefetch_batches < 0:
    raise ConfigError(f"config.prefetch_batches must be >= 0, got {config.prefetch_batches}")
  if config.data_workers < -1:
    raise ConfigError(f"config.data_workers must be >= 0, or -1 for automatic, got "
                      f"{config.data_workers}")
  for key in ("bleu_every_steps", "test_bleu_every_steps", "checkpoint_every_minutes"):
    if config[key] < 0:
      raise ConfigError(f"config.{key} must be >= 0 (0 = never), got {config[key]}")
  if not 0.0 <= config.label_smoothing < 1.0:
    raise ConfigError(f"config.label_smoothing must be in [0, 1), got {config.label_smoothing}")
  if not 0.0 <= config.subword_sampling_alpha < 1.0:
    raise ConfigError("config.subword_sampling_alpha must be in [0, 1) (0 = off), got "
                      f"{config.subword_sampling_alpha}")
  if config.nan_policy not in ("stop", "skip"):
    raise ConfigError(f"config.nan_policy must be 'stop' or 'skip', got {config.nan_policy!r}")
  if config.cross_entropy_backward not in CROSS_ENTROPY_BACKWARDS:
    raise ConfigError(f"config.cross_entropy_backward must be one of {CROSS_ENTROPY_BACKWARDS}, "
                      f"got {config.cross_entropy_backward!r}")
  if config.prng_impl not in PRNG_IMPLS:
    raise ConfigError(f"config.prng_impl must be one of {', '.join(PRNG_IMPLS)}, got "
                      f"{config.prng_impl!r}")
  if config.profile_steps < 0 or config.profile_first_step < 0:
    raise ConfigError("config.profile_steps and config.profile_first_step must be >= 0, got "
                      f"{config.profile_steps} and {config.profile_first_step}")
  model = model_config_from(config)
  longest = max(config.max_source_length, config.max_target_length)
  if longest > model.max_len:
    raise ConfigError(f"config.max_source_length/max_target_length ({longest}) exceed "
                      f"config.model.max_len ({model.max_len}); raise model.max_len")


class StopRequest:
  """SIGTERM / SIGINT ask the loop to checkpoint and exit cleanly (exit status 0).

  One process: a handler notes the signal and the loop stops after the step it
  is in. Several: all must stop after the same step, so SIGTERM is left to
  jax.distributed's preemption service (its own handler spreads the notice to
  every process, and `Checkpointer.reached_preemption(step)` turns true on all of
  them at the same step), and SIGINT is passed on to it as a SIGTERM.
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
    if self.received is not None:  # Second signal: stop now.
      raise KeyboardInterrupt
    self.received = signal.Signals(signum).name
    if self.several:
      logging.warning("%s received: asking every process to stop at one step and save",
                      self.received)
      os.kill(os.getpid(), signal.SIGTERM)  # To the preemption service's handler.
      return
    self.signal_name = self.received
    logging.warning("%s received: saving a checkpoint, then exiting", self.signal_name)

  def requested(self, step: int) -> bool:
    """Whether the loop stops after `step` (1-based; several processes: call it at
    every step, the same on all)."""
    if self.several and self.signal_name is None and self.checkpointer.reached_preemption(step):
      self.signal_name = self.received or "SIGTERM"
      logging.warning("Preemption notice (%s) reached every process: saving step %d, then "
                      "exiting", self.signal_name, step)
    return self.signal_name is not None


def _format_seconds(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
      f"{seconds // 60}m{seconds % 60:02d}s"


def _memory() -> str:
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


@dataclasses.dataclass
class EvalSet:
  """Tokenized evaluation pairs and their raw references (for BLEU)."""

  ids: list  # (source ids, target ids) per pair.
  references: list[str]


def _eval_set(config, tokenizer, split: str) -> EvalSet:
  pairs = load_pairs(config, split, config.eval_dataset_name or None)
  pairs = [pairs[i] for i in range(len(pairs))]
  return EvalSet(ids=[(tokenizer.tokenize(s), tokenizer.tokenize(t)) for s, t in pairs],
                 references=[t for _, t in pairs])


@dataclasses.dataclass(frozen=True)
class Due:
  """The periodic work that follows one step."""

  log: bool = False
  eval: bool = False
  bleu: bool = False
  test_bleu: bool = False
  save: bool = False

  def any(self) -> bool:
    return any(dataclasses.astuple(self))


def due_after(config, step: int, stopping: bool = False,
              seconds_since_save: float = 0.0) -> Due:
  """What step `step` (1-based) is followed by: each cadence, the last step, a signal.

  `checkpoint_every_minutes` (the paper saved every 10 minutes) is checked at log
  steps only: in a multi-process run every process must take the same decision,
  and process 0's clock is broadcast to the others there, not at every step.
  """
  last = step == config.num_train_steps

  def every(n: int) -> bool:  # n = 0: never (BLEU cadences), except at the last step.
    return n > 0 and (step % n == 0 or last)

  log = every(config.log_every_steps)
  by_time = (config.checkpoint_every_minutes > 0 and log
             and distributed.agreed(seconds_since_save >= 60 * config.checkpoint_every_minutes))
  return Due(log=log or stopping,
             eval=every(config.eval_every_steps), bleu=every(config.bleu_every_steps),
             test_bleu=every(config.test_bleu_every_steps),
             save=every(config.checkpoint_every_steps) or by_time or stopping)


class Evaluation:
  """Eval loss and beam-search BLEU of the current parameters, on fixed batch shapes."""

  def __init__(self, config, model_config: TransformerConfig, trainer: Trainer, tokenizer,
               place, dp_size: int):
    self.config, self.trainer, self.tokenizer, self.place = config, trainer, tokenizer, place
    self.mesh, self.dp_size, self.max_len = trainer.mesh, dp_size, model_config.max_len
    self.sets = {"": _eval_set(config, tokenizer, config.eval_split)}
    if config.test_bleu_every_steps > 0:  # Only ever reported (time to quality).
      self.sets["test_"] = _eval_set(config, tokenizer, config.test_split)
    self.host_batches = []  # Formed once; placed on the devices at each evaluation.
    for batch in batching.eval_batches(self.sets[""].ids, batch_tokens=config.eval_batch_tokens,
                                       max_length=self.max_len, row_multiple=dp_size,
                                       max_widths=config.eval_max_shapes):
      if 0 <= config.num_eval_steps <= len(self.host_batches):
        break
      batch.pop("index")
      self.host_batches.append(batch)
    logging.info("Evaluation: %d batches in %d shape(s) (cap config.eval_max_shapes=%d)",
                 len(self.host_batches), len({b["inputs"].shape for b in self.host_batches}),
                 config.eval_max_shapes)
    search = SearchConfig(beam_size=config.beam_size, alpha=config.alpha,
                          max_extra=config.max_extra)
    self.search_fn = per_shape(
        jax.jit(make_search_fn(model_config, search),
                out_shardings=sharding_lib.replicated(self.mesh)),
        search, max_shapes=config.eval_max_shapes * len(self.sets),  # Each set's widths.
        context=lambda: jax.set_mesh(self.mesh))

  def _bleu_sources(self, prefix: str) -> list:
    pairs, n = self.sets[prefix], self.config.num_bleu_sentences
    return [s for s, _ in pairs.ids[:len(pairs.ids) if n < 0 else n]]

  def compile_ahead(self) -> None:
    """Starts compiling every eval and BLEU shape this run will use, in the background."""
    config, trainer = self.config, self.trainer
    abstract = lambda shape: jax.ShapeDtypeStruct(  # noqa: E731
        shape, np.int32, sharding=trainer.batch_sharding)
    for shape in dict.fromkeys(b["inputs"].shape for b in self.host_batches):
      trainer.compile_eval_ahead({k: abstract(shape) for k in self.host_batches[0]})
    key = jax.eval_shape(lambda: batch_keys(0, 1)[0])  # As translate_ids makes them.
    for prefix, every in (("", config.bleu_every_steps), ("test_", config.test_bleu_every_steps)):
      if every > 0 and prefix in self.sets:
        batches = search_batches(self._bleu_sources(prefix), **self._search_batching())
        for shape in dict.fromkeys(b["inputs"].shape for b in batches):
          self.search_fn.compile_ahead(trainer.abstract_state.params, abstract(shape), key)

  def _search_batching(self) -> dict:
    return dict(batch_tokens=self.config.eval_batch_tokens, max_length=self.max_len,
                row_multiple=self.dp_size, max_widths=self.config.eval_max_shapes)

  def __call__(self, params, due: Due) -> dict[str, float]:
    out = {}
    if due.eval:
      out.update(evaluate(self.trainer, params, (self.place(b) for b in self.host_batches)))
    if due.bleu:
      out.update(self.bleu(params, ""))
    if due.test_bleu:
      out.update(self.bleu(params, "test_"))
    return out

  def bleu(self, params, prefix: str) -> dict[str, float]:
    sources = self._bleu_sources(prefix)
    with jax.set_mesh(self.mesh):
      hyps = translate_ids(self.search_fn, params, sources,
                           place=lambda x: self.place({"inputs": x})["inputs"],
                           **self._search_batching())
    hypotheses = [self.tokenizer.detokenize(h[0][0]) for h in hyps]
    references = self.sets[prefix].references[:len(sources)]
    return {prefix + "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            prefix + "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}


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


def log_line(config, step: int, summary: dict[str, float], due: Due) -> str:
  eta = (config.num_train_steps - step) * summary["step_time_s"]
  line = (f"step {step}/{config.num_train_steps} | loss {summary['loss']:.4f} | "
          f"lr {summary['learning_rate']:.2e} | {summary['tokens_per_s']:,.0f} tok/s | "
          f"{summary['step_time_s']:.3f} s/step | ETA {_format_seconds(eta)} | {_memory()}")
  if "mfu" in summary:
    line += f" | MFU {100 * summary['mfu']:.1f}%"
  if due.eval:
    line += (f" || eval loss {summary['eval_loss']:.4f} ppl {summary['eval_perplexity']:.2f}"
             f" acc {summary['eval_accuracy']:.3f}")
  if due.bleu:
    line += f" BLEU {summary['bleu']:.2f} chrF {summary['chrf']:.2f}"
  if due.test_bleu:
    line += (f" | {config.test_split} BLEU {summary['test_bleu']:.2f}"
             f" chrF {summary['test_chrf']:.2f}")
  return line


@dataclasses.dataclass
class Run:
  """Everything a training run holds, built by `setup_run`."""

  config: Any
  workdir: workdir_lib.Workdir
  trainer: Trainer
  train_iter: Any  # Device batches, prefetched; its state is checkpointed.
  checkpointer: Checkpointer
  evaluation: Evaluation
  writer: Any
  stop: StopRequest
  meter: StepMeter
  state: Any
  start_step: int
  opened: contextlib.ExitStack  # Releases the above's threads, files and signal handlers.

  saved_at: float = dataclasses.field(default_factory=time.monotonic)  # Or started.
  lock: launch_lock.LaunchLock | None = None  # The workdir's, on process 0.

  def save(self, step: int, state) -> None:
    try:
      self.checkpointer.save(step, state, self.train_iter, force=True)
    except CheckpointSaveError:
      # A save fails when the workdir is deleted under it: say that, not "disk full?".
      workdir_lib.check_present(self.workdir, step)
      raise
    self.saved_at = time.monotonic()

  def close(self, after_error: bool = False) -> None:
    """Waits for the last save, then releases everything setup_run opened (checkpoints,
    metrics, the input pipeline's threads and workers, signal handlers). After an
    error, on every exit path, a failure here is logged, not raised over the first one."""
    try:
      try:
        self.checkpointer.wait()
      finally:
        self.opened.close()  # Every callback runs even if one raises.
    except Exception as e:  # noqa: BLE001
      if not after_error:
        raise
      logging.warning("Closing the run after an error failed too: %s", e)


INPUT_CLOSE_TIMEOUT_S = 30.0


def close_input(iterator, timeout_s: float = INPUT_CLOSE_TIMEOUT_S) -> None:
  """Stops an input iterator's prefetch threads and worker processes, waiting at most
  `timeout_s` seconds.

  Bounded because grain's ThreadPrefetchDatasetIterator.close joins its producer thread
  with no timeout, forever if the producer is blocked in its parent's __next__ (grain
  PR #1373); those threads and grain's worker processes are daemons, ended with this
  process. An iterator without `close` (grain before DatasetIterator.close) is left to
  the garbage collector. An error of `close` is raised here.
  """
  close = getattr(iterator, "close", None)
  if close is None:
    return
  errors = []

  def run():
    try:
      close()
    except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
      errors.append(e)

  closer = threading.Thread(target=run, name="close_input", daemon=True)
  closer.start()
  closer.join(timeout_s)
  if closer.is_alive():
    logging.warning("The input pipeline did not stop within %.0f s; its threads and worker "
                    "processes end with this process", timeout_s)
  elif errors:
    raise errors[0]


def setup_run(config, workdir: workdir_lib.Workdir, launch: dict | None = None) -> Run:
  """Checks the config, builds mesh, data, model, evaluation; restores or initialises.

  If any of it fails (a bad config, every checkpoint damaged), what was opened so far
  is released before the error propagates; otherwise `Run.close` releases it.
  """
  with contextlib.ExitStack() as opened:
    run = _build_run(config, workdir, launch, opened)
    run.opened = opened.pop_all()
    return run


def _build_run(config, workdir: workdir_lib.Workdir, launch: dict | None,
               opened: contextlib.ExitStack) -> Run:
  """setup_run's work; each resource's release is pushed onto `opened` as it is acquired."""
  workdir.root.mkdir(parents=True, exist_ok=True)
  check_config(config)
  # Before anything is written: a second launch on this workdir stops here (launch_lock).
  lock = opened.enter_context(launch_lock.hold(workdir, launch))
  compilation.enable_cache(config.compilation_cache_dir)
  model_config = model_config_from(config)
  process_index, process_count = jax.process_index(), jax.process_count()
  mesh = sharding_lib.make_mesh(config.mesh)
  dp_size = sharding_lib.data_parallel_size(mesh)
  train_batching = data_lib.train_batching(config, dp_size, process_count)
  global_rows = train_batching.rows * process_count
  sharding_lib.check_divisible(global_rows, mesh)
  if global_rows % (dp_size * config.grad_accum_steps):
    raise ConfigError(f"global batch of {global_rows} rows does not split into "
                      f"config.grad_accum_steps={config.grad_accum_steps} micro-batches over "
                      f"{dp_size} data-parallel devices")

  logging.info("Devices: %d (%s), mesh %s, %d process(es); host memory: %s; XLA_FLAGS: %s; "
               "PRNG %s (threefry GPU kernel %s); cross entropy backward: %s",
               jax.device_count(), jax.devices()[0].platform, dict(mesh.shape), process_count,
               host_allocator.describe(), os.environ.get("XLA_FLAGS", "") or "(none)",
               config.prng_impl, "on" if jax.config.jax_threefry_gpu_kernel_lowering else "off",
               config.cross_entropy_backward)
  for line in prepare_data(config, process_index, process_count,  # Process 0's, once.
                          barrier=distributed.wait_at_barrier):
    logging.info("Data: %s", line)
  train_pairs = load_pairs(config, config.train_split)
  logging.info("Training pairs: %d (%s)", len(train_pairs), config.dataset_name)
  tokenizer = data_lib.build_tokenizer(config, workdir.vocab_file, train_pairs, process_index)
  if tokenizer.vocab_size != model_config.vocab_size:
    logging.info("Model vocabulary size %d -> %d (the vocabulary's)", model_config.vocab_size,
                 tokenizer.vocab_size)
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
  if process_index == 0:
    code = provenance.describe(jax.devices())
    if code.get("git_dirty"):
      logging.warning("The checkout has uncommitted changes to %s: this launch records their "
                      "diff in %s (launches[-1].git_diff) beside commit %s. Commit before a "
                      "run you will report.", ", ".join(code["git_dirty_files"]),
                      workdir.run_file, code["git_commit"][:7])
    workdir_lib.record_run(workdir, model_config, tokenizer.vocab_size, launch={
        **(launch or {}), "config": config.to_dict(), "process_count": process_count, **code})

  trainer = Trainer(model_config, config, mesh)

  def place_local(batch):
    """This host's rows of a training batch -> the global, sharded batch."""
    return data_lib.to_global_arrays(batch, trainer.batch_sharding)

  def place(batch):
    """A global batch every host holds (eval, BLEU) -> the global, sharded batch."""
    return place_local(data_lib.host_rows(batch, process_index, process_count))

  workers = data_lib.auto_workers(config.data_workers)
  tokenize = data_lib.TokenizePair(tokenizer, config.subword_sampling_alpha)
  train_ids = data_lib.training_ids(config, train_pairs, tokenize)
  train_iter = iter(data_lib.prefetched(
      data_lib.train_dataset(
          train_pairs if train_ids is None else train_ids, train_batching, seed=config.seed,
          process_index=process_index, process_count=process_count,
          tokenize=tokenize if train_ids is None else None),
      place_local, workers=workers, device_buffer=config.prefetch_batches))
  opened.callback(close_input, train_iter)  # Its prefetch threads and worker processes.
  logging.info("Input pipeline: %d worker process(es), %d batch(es) prefetched to the devices",
               workers, config.prefetch_batches)
  evaluation = Evaluation(config, model_config, trainer, tokenizer, place, dp_size)
  if config.compile_ahead:  # While the parameters initialise and the train step compiles.
    evaluation.compile_ahead()
  checkpointer = Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
  opened.callback(checkpointer.close)
  start_step, state = checkpointer.restore_latest(trainer.abstract_state, train_iter)
  if state is None:
    start_step, state = 0, trainer.init_state(config.seed)
    logging.info("Starting from scratch in %s", workdir)
  else:
    logging.info("Resumed from the checkpoint of step %d", start_step)
  writer = create_writer(workdir, process_index)
  opened.callback(writer.close)
  if start_step == 0:
    writer.write_hparams({"model": model_config.to_dict(), **config.to_dict()})
  stop = StopRequest(checkpointer)
  stop.install(start_step)
  opened.callback(stop.uninstall)
  # Analytic (XLA's own count differs between backends): gflops_per_s and MFU in the log.
  step_flops = train_step_flops(model_config, global_rows, config.max_source_length,
                                config.max_target_length)
  # Only process 0 logs and writes the wall time: the others need not read every metrics
  # object of a bucket workdir.
  meter = StepMeter(config, step_flops, start_step,
                    previous_wall_time(workdir) if process_index == 0 else 0.0)
  return Run(config, workdir, trainer, train_iter, checkpointer, evaluation, writer, stop,
             meter, state, start_step, opened, lock=lock)


def train_and_evaluate(config, workdir: str, launch: dict | None = None) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns last metrics.

  launch: how this start was asked for (train.py: config file, overrides, argv), for
  the workdir's run record.
  """
  began = time.monotonic()
  # setup_run releases what it opened if it fails; from here on, run.close does.
  run = setup_run(config, workdir_lib.Workdir(workdir), launch)
  try:
    state, step, last = run.state, run.start_step, {}
    batch = next(run.train_iter)  # Already on the devices (`data.pipeline.prefetched`).
    logging.info("First training batch on the devices in %.1f s (from the start of setup)",
                 time.monotonic() - began)
    run.trainer.compile_train_step(state, batch)
    run.meter.restart(step)
    profile = Profile(config, run.workdir, step)
    while step < config.num_train_steps:
      profile.before(step)
      state, metrics = run.trainer.train_step(state, batch)
      step += 1
      profile.after(step, state)
      run.meter.add(step, metrics)
      if jax.process_count() == 1:  # Several: at the due steps below, agreed on by all.
        launch_lock.check(run.lock, step)  # Another launch took the workdir over: stop here.
      due = due_after(config, step, stopping=run.stop.requested(step),
                      seconds_since_save=time.monotonic() - run.saved_at)
      if not due.any():
        batch = next(run.train_iter)  # Overlaps with the device computing this step.
        continue

      workdir_lib.check_present(run.workdir, step)
      launch_lock.check(run.lock, step, everywhere=True)
      summary = run.meter.summary(step, run.checkpointer)
      summary.update(run.evaluation(state.params, due))
      summary["wall_s"] = run.meter.wall_s()
      logging.info("%s", log_line(config, step, summary, due))
      run.writer.write_scalars(step, summary)
      run.writer.flush()
      last = summary
      if due.save or run.stop.signal_name:  # A signal may arrive while logging or evaluating.
        launch_lock.check(run.lock, step, everywhere=True)  # Evaluating may take minutes.
        run.save(step, state)
      if run.stop.signal_name:
        logging.warning("Stopped by %s at step %d; checkpoint saved", run.stop.signal_name, step)
        break
      if step < config.num_train_steps:
        # Only now: a checkpoint must hold the iterator before this batch is drawn.
        batch = next(run.train_iter)
      run.meter.restart(step)
    profile.after(step, state, stopping=True)
  except BaseException:
    run.close(after_error=True)
    raise
  run.close()
  return last


class Profile:
  """A jax.profiler trace of config.profile_steps steps of this launch (process 0).

  The trace starts after config.profile_first_step steps (past the compiles) and
  goes to WORKDIR/profile, where TensorBoard's profile plugin and Perfetto find it.
  """

  def __init__(self, config, workdir: workdir_lib.Workdir, start_step: int):
    self.first = start_step + config.profile_first_step
    self.last = self.first + config.profile_steps
    self.wanted = config.profile_steps > 0 and jax.process_index() == 0
    self.directory, self.tracing = workdir.profile, False

  def before(self, step: int) -> None:
    if self.wanted and step == self.first:
      # jax's profiler writes local files only: a bucket's trace is uploaded at the end.
      self.local = storage.local_dir_for(self.directory, prefix="profile-")
      jax.profiler.start_trace(self.local)
      self.tracing = True

  def after(self, step: int, state, stopping: bool = False) -> None:
    if self.tracing and (step >= self.last or stopping):
      jax.block_until_ready(state)  # The traced steps' device work, whole.
      jax.profiler.stop_trace()
      storage.upload_tree(self.local, self.directory)
      if storage.is_remote(self.directory):
        shutil.rmtree(self.local, ignore_errors=True)
      self.tracing, self.wanted = False, False
      logging.info("Profile of steps %d-%d written to %s", self.first + 1, step, self.directory)
