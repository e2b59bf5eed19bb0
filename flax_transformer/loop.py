"""The training loop: data in, sharded steps, evaluation, checkpoints, metrics out.

`train_and_evaluate(config, workdir)` is everything `train.py` does; `setup_run`
builds what a run holds (`Run`) from parts in `flax_transformer.training` (config
checks, cadence, progress, stop request, profiling) and `flax_transformer.evaluation`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import os
import time
from typing import Any

import jax

from flax_transformer import compilation, host_allocator, launch_lock
from flax_transformer import workdir as workdir_lib
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.data import pipeline as data_lib
from flax_transformer.data.sources import load_pairs, prepare_datasets
from flax_transformer.errors import CheckpointSaveError
from flax_transformer.evaluation import Evaluation
from flax_transformer.training import distributed, init_from
from flax_transformer.training import sharding as sharding_lib
from flax_transformer.training.cadence import work_due_after
from flax_transformer.training.config_checks import check_config
from flax_transformer.training.metrics import create_writer
from flax_transformer.training.profiling import Profile
from flax_transformer.training.progress import StepMeter, log_line, run_meter
from flax_transformer.training.steps import Trainer
from flax_transformer.training.stop_request import StopRequest
from flax_transformer.training.vocabulary import run_vocabulary

# Steps dispatched to the devices that may not have run yet. Dispatch runs ahead of the
# devices until a value is fetched (the next log step's metrics: 50 steps in the README's
# config), and a stop (SIGTERM: a preemption notice) waits for all of them; two keep the
# devices fed while the host dispatches the next.
STEPS_IN_FLIGHT = 2


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

  def due_work(self, step: int, state, due) -> dict[str, Any]:
    """The work `due` (`work_due_after`) after `step`: a save, evaluation, the log line."""
    workdir_lib.check_present(self.workdir, step)
    launch_lock.check(self.lock, step, everywhere=True)
    summary = self.meter.summary(step, self.checkpointer)
    if due.save:  # Written (asynchronously) while evaluating: a stop then need not wait.
      self.save(step, state)
    summary.update(self.evaluation(state.params, due, stop=self.stop.arrived))
    summary["wall_s"] = self.meter.wall_s()
    logging.info("%s", log_line(self.config, step, summary))
    self.writer.write_scalars(step, summary)
    self.writer.flush()
    return summary

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


def setup_run(config, workdir: workdir_lib.Workdir, launch: dict | None = None) -> Run:
  """Checks the config, builds mesh, data, model, evaluation; restores or initialises.

  If any of it fails (a bad config, every checkpoint damaged), what was opened so far
  is released before the error propagates; otherwise `Run.close` releases it.
  """
  with contextlib.ExitStack() as opened:
    # Pushed first, so run last on a failure: after the input pipeline and checkpointer close.
    opened.push(lambda error, *_: error is not None and compilation.cancel_queued())
    run = _build_run(config, workdir, launch, opened)
    run.opened = opened.pop_all()
    return run


def _build_run(config, workdir: workdir_lib.Workdir, launch: dict | None,
               opened: contextlib.ExitStack) -> Run:
  """setup_run's work; each resource's release is pushed onto `opened` as it is acquired."""
  fine_tuning = init_from.resolve(config, workdir, (launch or {}).get("overrides"))
  check_config(config, fine_tuning and fine_tuning.model_config)
  workdir.root.mkdir(parents=True, exist_ok=True)
  # Before anything is written: a second launch on this workdir stops here (launch_lock).
  lock = opened.enter_context(launch_lock.hold(workdir, launch))
  compilation.enable_cache(config.compilation_cache_dir)
  process_index, process_count = jax.process_index(), jax.process_count()
  mesh = sharding_lib.make_mesh(config.mesh)
  # A fine-tuning's model is known: a mesh it does not fit is refused before run.json.
  trainer = fine_tuning and Trainer(fine_tuning.model_config, config, mesh)
  dp_size = sharding_lib.data_parallel_size(mesh)
  train_batching = data_lib.train_batching(config, dp_size, process_count)
  global_rows = train_batching.rows * process_count
  sharding_lib.check_divisible(global_rows, mesh, micro_batches=config.grad_accum_steps)
  _log_devices(config, mesh, process_count)
  for line in prepare_datasets(config, process_index, process_count,  # Process 0's, once.
                          barrier=distributed.wait_at_barrier):
    logging.info("Data: %s", line)
  train_pairs = load_pairs(config, config.train_split, None, fine_tuning and fine_tuning.languages)
  logging.info("Training pairs: %d (%s)", len(train_pairs), config.dataset_name)
  tokenizer, model_config = run_vocabulary(config, workdir, train_pairs, launch, fine_tuning)
  trainer = trainer or Trainer(model_config, config, mesh)
  trainer.compile_train_step_ahead(train_batching.abstract_batch(process_count,
                                                                 trainer.batch_sharding))
  # This host's rows of a training batch, or a global batch every host holds (evaluation,
  # BLEU) -> the global batch, sharded.
  shard_host_rows = functools.partial(data_lib.shard_host_rows, sharding=trainer.batch_sharding)
  shard_global_batch = functools.partial(data_lib.shard_global_batch,
                                         sharding=trainer.batch_sharding)
  train_iter = data_lib.training_input(config, train_pairs, tokenizer, train_batching,
                                        shard_host_rows)
  opened.callback(data_lib.close_input, train_iter)  # Its prefetch threads and workers.
  evaluation = Evaluation(config, model_config, trainer, tokenizer, shard_global_batch,
                          dp_size, fine_tuning and fine_tuning.languages)
  if config.compile_ahead:  # While the parameters initialise and the train step compiles.
    evaluation.compile_ahead()
  checkpointer = Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
  opened.callback(checkpointer.close)
  start_step, state = checkpointer.restore_latest(trainer.abstract_state, train_iter)
  if state is None and fine_tuning:
    start_step, state = 0, init_from.initial_state(trainer, fine_tuning)
  elif state is None:
    start_step, state = 0, trainer.init_state(config.seed)
    logging.info("Starting from scratch in %s", workdir)
  else:
    logging.info("Resumed from the checkpoint of step %d", start_step)
  writer = create_writer(workdir, process_index)
  opened.callback(writer.close)
  if start_step == 0:
    # The run's model, not config.model: the vocabulary's size, a fine-tuning source's model.
    writer.write_hparams({**config.to_dict(), "model": model_config.to_dict()})
  stop = StopRequest(checkpointer)
  stop.install(start_step)
  opened.callback(stop.uninstall)
  meter = run_meter(config, model_config, global_rows, start_step, workdir)
  return Run(config, workdir, trainer, train_iter, checkpointer, evaluation, writer, stop,
             meter, state, start_step, opened, lock=lock)


def _log_devices(config, mesh, process_count: int) -> None:
  logging.info("Devices: %d (%s), mesh %s, %d process(es); host memory: %s; XLA_FLAGS: %s; "
               "PRNG %s (threefry GPU kernel %s); cross entropy backward: %s",
               jax.device_count(), jax.devices()[0].platform, dict(mesh.shape), process_count,
               host_allocator.describe(), os.environ.get("XLA_FLAGS", "") or "(none)",
               config.prng_impl, "on" if jax.config.jax_threefry_gpu_kernel_lowering else "off",
               config.cross_entropy_backward)


def train_and_evaluate(config, workdir: str, launch: dict | None = None) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints); returns last metrics.

  launch: how this start was asked for (train.py: config file, overrides, argv), recorded.
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
    in_flight = collections.deque()  # Each dispatched step's metrics, until it has run.
    while step < config.num_train_steps:
      profile.before(step)
      state, metrics = run.trainer.train_step(state, batch)
      step += 1
      in_flight.append(metrics)
      if len(in_flight) > STEPS_IN_FLIGHT:  # The devices still have the others to run.
        jax.block_until_ready(in_flight.popleft())
      profile.after(step, state)
      run.meter.add(step, metrics)
      if jax.process_count() == 1:  # Several: at the due steps below, agreed on by all.
        launch_lock.check(run.lock, step)  # Another launch took the workdir over: stop here.
      due = work_due_after(config, step, stopping=run.stop.requested(step),
                      seconds_since_save=time.monotonic() - run.saved_at)
      if not due.any():
        batch = next(run.train_iter)  # Overlaps with the device computing this step.
        continue

      last = run.due_work(step, state, due)
      if run.stop.signal_name and not due.save:  # It arrived while logging or evaluating.
        launch_lock.check(run.lock, step, everywhere=True)  # Evaluating may take minutes.
        run.save(step, state)
      if run.stop.signal_name:
        logging.warning("Stopped by %s at step %d; checkpoint saved", run.stop.signal_name, step)
        compilation.cancel_queued()  # Compiles queued ahead for later evaluations: not run.
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
