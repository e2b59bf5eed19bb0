"""Checkpoints of the training state and the data iterator (orbax): saving, restoring
the newest that loads (agreed on by every process), setting damaged ones aside.

Layout: `<workdir>/checkpoints/<step>/{state,data}`; orbax writes each step to a
temporary directory and renames it when complete, so a crash mid-save leaves
the previous checkpoints as they were. Their average is `flax_transformer.averaging`'s;
in a bucket, TensorStore reaches S3 through `storage.tensorstore_reaches_s3`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from pathlib import Path
from typing import Any, Sequence

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from flax_transformer import collectives, storage
from flax_transformer.errors import CheckpointError, CheckpointSaveError
from flax_transformer.workdir import Workdir

# The chunk of an uncopied host array's write (Checkpointer's host_arrays_uncopied).
CHUNK_BYTES = 64 << 20
# How long a failed save's other writes get to end before they are cancelled.
WRITES_END_S = 120.0


def finish_every_write() -> None:
  """Has each call of orbax's `asyncio_utils.run_sync` (which runs a save's or a
  restore's coroutine in a fresh event loop) return only once every task the coroutine
  started has ended, not at the first failure.

  orbax (0.12) gathers an array's TensorStore writes with asyncio.gather, and the loop
  ends when the gather raises: the other writes go on in TensorStore's threads after
  `save` has raised, into the directory a caller is removing ("Directory not empty",
  files back after the clean-up). The coroutine is wrapped so that, before returning or
  raising, it waits for its loop's other tasks (each awaits its write), cancelling those
  still running after WRITES_END_S. orbax-checkpoint 0.12.3 to 0.12.8 call
  `asyncio_utils.run_sync` by that name; tests/test_private_apis.py checks it is there.
  """
  from orbax.checkpoint._src import asyncio_utils

  run_sync = asyncio_utils.run_sync
  if getattr(run_sync, "finishes_every_write", False):
    return

  def run_finishing(coro):
    return run_sync(_after_every_task(coro))

  run_finishing.finishes_every_write = True
  asyncio_utils.run_sync = run_finishing


async def _after_every_task(coro):
  try:
    return await coro
  finally:
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
      _, running = await asyncio.wait(others, timeout=WRITES_END_S)
      for task in running:
        task.cancel()
      if running:
        logging.warning("%d checkpoint writes still running after %.0f s: cancelled",
                        len(running), WRITES_END_S)
        await asyncio.wait(running, timeout=10)
    for task in others:  # Retrieved: no "Task exception was never retrieved" at exit.
      if task.done() and not task.cancelled():
        task.exception()


finish_every_write()


class Checkpointer:
  """Saves and restores {'state': pytree, 'data': grain iterator} per step."""

  def __init__(self, workdir: str | Path, *, max_to_keep: int | None = None,
               asynchronous: bool = True, read_only: bool = False,
               host_arrays_uncopied: bool = False):
    """host_arrays_uncopied: numpy leaves are written from the caller's arrays, not from
    a whole copy orbax takes first (its guard against a caller changing them during an
    asynchronous save), in chunks of CHUNK_BYTES, one zarr file each, not through OCDBT
    (whose writer held every chunk until its data files were written). For a synchronous
    save of arrays nobody changes: an import's, whose peak RSS these took from 6.6 GB to
    3.3 GB on NLLB-600M's shape (bench/import_memory.py). orbax's readers read both
    layouts (each checkpoint says which it is)."""
    self.host_arrays_uncopied = host_arrays_uncopied
    self.directory = Workdir(workdir).checkpoints
    bucket_options = {}
    if storage.is_remote(self.directory):
      storage.drop_cached_listings(self.directory)  # Steps saved by other processes since.
      storage.tensorstore_reaches_s3()
      # Objects cannot be renamed in one step: a checkpoint is complete when its
      # commit_success.txt is written last (orbax's choice for gs://, made for s3:// too).
      bucket_options["temporary_path_class"] = ocp.path.atomicity.CommitFileTemporaryPath
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=asynchronous, cleanup_tmp_directories=not read_only,
        **bucket_options)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_handlers=_item_handlers(host_arrays_uncopied))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any, data_iterator=None, *, force: bool = False) -> bool:
    """Starts saving (asynchronously); the data iterator's position is taken now."""
    chunked = {}
    if self.host_arrays_uncopied:
      chunked = dict(save_args=jax.tree_util.tree_map(
          lambda _: ocp.SaveArgs(chunk_byte_size=CHUNK_BYTES), state))
    items = {"state": ocp.args.PyTreeSave(state, **chunked)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    try:
      return self.manager.save(step, args=ocp.args.Composite(**items), force=force)
    except Exception as e:  # Includes a failure of the previous asynchronous save.
      raise self._save_error(step, e) from None

  def wait(self) -> None:
    """Blocks until asynchronous saves are written; raises CheckpointSaveError if one failed."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      raise self._save_error(None, e) from None

  def _save_error(self, step, error: BaseException) -> CheckpointSaveError:
    what = f"checkpoint of step {step}" if step is not None else "a checkpoint"
    kept = self.steps()
    return CheckpointSaveError(
        f"writing {what} to {self.directory} failed ({type(error).__name__}: "
        f"{_first_line(error)}); is the disk full or the directory unwritable? "
        f"Complete checkpoints are intact: steps {kept}")

  def reached_preemption(self, step: int) -> bool:
    """Whether every process has reached the step at which a preemption notice
    (SIGTERM to any process of a jax.distributed run) has them all save; call it at
    every step. Always false in a single process."""
    return self.manager.reached_preemption(step)

  def close(self) -> None:
    self.manager.close()

  def restore_latest(self, abstract_state: Any, data_iterator=None):
    """(step, state) of the newest checkpoint that loads, or (None, None) if there are none.

    A newer checkpoint that fails to load is reported and skipped; if every one
    fails, CheckpointError: existing work is never silently replaced by a fresh start.
    With several processes, a step counts as loaded only if it loaded in every one:
    each tries it, then all agree (one collective), so that all resume from one step
    even when the damage is one process's own (its data-iterator file).
    """
    steps = self.steps()
    self._check_same_steps(steps)
    problems = []
    reader = ocp.CompositeCheckpointHandler(**_item_handlers())
    try:
      for step in reversed(steps):
        for attempt in range(2):  # Read twice: one host's passing error (a bucket's 503).
          state, own = self._read(reader, step, abstract_state, data_iterator)
          failed = {i: p for i, p in enumerate(collectives.each_process_text(own)) if p}
          if not failed:
            break
          state = None  # Never two states in memory while the next read runs.
        if not failed:
          if problems:
            logging.warning("Resumed from step %d; newer checkpoints were unusable: %s", step,
                            "; ".join(problems))
            self._set_aside([s for s in steps if s > step])
          return step, state
        problem = f"step {step}: " + (own if jax.process_count() == 1 else "; ".join(
            f"process {i}: {p}" for i, p in failed.items()))
        problems.append(problem)
        logging.warning("Checkpoint %s/%d cannot be loaded (%s); trying an older one",
                        self.directory, step, problem)
    finally:
      reader.close()
    if problems:
      raise CheckpointError(
          f"none of the {len(steps)} checkpoints in {self.directory} can be loaded ("
          + "; ".join(problems) + "). Refusing to start from scratch over existing work: "
          "fix or move that directory away.")
    return None, None

  def _check_same_steps(self, steps: Sequence[int]) -> None:
    """Refuses to resume when the processes list different checkpoints (each lists its
    own: a file system that shows hosts different files, a stale bucket listing): they
    would resume from different steps."""
    if jax.process_count() == 1:
      return
    mine = f"{zlib.crc32(repr(list(steps)).encode())}|{list(steps)[-3:]}"
    seen = collectives.each_process_text(mine)
    if len(set(seen)) > 1:
      raise CheckpointError(
          f"the processes list different checkpoints in {self.directory} (newest steps: "
          + "; ".join(f"process {i}: {s.split('|', 1)[1]}" for i, s in enumerate(seen))
          + "). Every host must see the same files: a network file system's attribute "
          "cache, or a copy per host, would have them resume from different steps.")

  def _read(self, reader, step: int, abstract_state: Any, data_iterator) -> tuple[Any, str]:
    """(state, "") or (None, what failed): this process's part of checkpoint `step` (the
    state shaped and sharded like `abstract_state`; sets the iterator).

    Read by orbax's handler itself, not CheckpointManager.restore: that ends in a barrier
    of every process (orbax 0.12: jax's sync_global_devices, a device collective without
    a timeout, of one name for every step) which a process whose read raised skips. The
    others would wait there for its next try, of an older step, and each would go on
    from its own step. `restore_latest` agrees on the outcome instead.
    """
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
    items = {"state": ocp.args.PyTreeRestore(item=abstract_state, restore_args=restore_args)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      restored = reader.restore(self.manager.directory / str(step),
                                args=ocp.args.Composite(**items))
    except Exception as e:  # orbax/tensorstore/grain raise many types for damaged files.
      return None, f"{type(e).__name__}: {_first_line(e)}"
    return restored["state"], ""

  def _set_aside(self, steps: Sequence[int]) -> None:
    """Renames unusable checkpoints (kept for inspection) so their steps can be saved anew.

    Process 0 renames; every process then waits for it and lists the steps again: one
    that still listed them would have orbax refuse to save them when training gets there.
    """
    if jax.process_index() == 0:
      stamp = time.strftime("%Y%m%d-%H%M%S")
      for step in steps:
        path = self.directory / str(step)
        if path.exists():
          aside = path.with_name(f"{step}.unusable-{stamp}")
          path.rename(aside)
          logging.warning("Moved the unusable checkpoint %s to %s", path, aside)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("flax_transformer_set_aside")
      storage.drop_cached_listings(self.directory)  # A bucket's listing from before the renames.
    self.manager.reload()

  def restore_params(self, step: int, abstract_params: Any, *,
                     fix: str = "choose other steps (--checkpoint_step, or fewer to average)"
                     ) -> Any:
    """Only the parameters of the checkpoint at `step` (no optimizer state), shaped,
    typed and sharded as `abstract_params`; `fix`: what the error tells the user to do."""
    target = {"params": abstract_params}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args,
                                       partial_restore=True)))
    except Exception as e:  # orbax/tensorstore raise many types for damaged files.
      raise CheckpointError(
          f"checkpoint {self.directory}/{step} cannot be loaded ({type(e).__name__}: "
          f"{_first_line(e)}); {fix}") from None
    return restored["state"]["params"]


class _NoOcdbtMergeWarning(logging.Filter):
  """orbax (0.12) merges OCDBT files after every save, OCDBT or not, and warns that a
  save without them (host_arrays_uncopied's) has none to merge: a line that means nothing."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "Skipping merge of OCDBT checkpoints" not in record.getMessage()


NO_OCDBT_MERGE_WARNING = _NoOcdbtMergeWarning()


def _item_handlers(host_arrays_uncopied: bool = False) -> dict:
  state = ocp.PyTreeCheckpointHandler()
  if host_arrays_uncopied:
    logging.getLogger("absl").addFilter(NO_OCDBT_MERGE_WARNING)  # Added once (same object).
    state = ocp.PyTreeCheckpointHandler(
        use_ocdbt=False,
        type_handler_registry=ocp.type_handlers.create_type_handler_registry(
            (jax.Array, ocp.type_handlers.ArrayHandler()),
            (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False))))
  return {"state": state, "data": grain.checkpoint.CheckpointHandler()}


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return text[0][:300] if text else ""
