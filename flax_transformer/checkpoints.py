"""Checkpoints of the training state and the data iterator (orbax), and their averages.

Layout: `<workdir>/checkpoints/<step>/{state,data}`; orbax writes each step to a
temporary directory and renames it when complete, so a crash mid-save leaves
the previous checkpoints as they were. `load_params` reads a workdir's parameters
with the paper's checkpoint averaging; `write_averaged` makes a workdir of one
averaged checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import linen as nn
from jax.experimental import multihost_utils

from flax_transformer import storage
from flax_transformer.errors import CheckpointError, CheckpointSaveError, ConfigError
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.model import Transformer
from flax_transformer.training import distributed
from flax_transformer.workdir import Workdir, read_run

class Checkpointer:
  """Saves and restores {'state': pytree, 'data': grain iterator} per step."""

  def __init__(self, workdir: str | Path, *, max_to_keep: int | None = None,
               asynchronous: bool = True, read_only: bool = False):
    self.directory = Workdir(workdir).checkpoints
    bucket_options = {}
    if storage.is_remote(self.directory):
      storage.forget_listings(self.directory)  # Steps saved by other processes since.
      _tensorstore_reaches_s3()
      # Objects cannot be renamed in one step: a checkpoint is complete when its
      # commit_success.txt is written last (orbax's choice for gs://, made for s3:// too).
      bucket_options["temporary_path_class"] = ocp.path.atomicity.CommitFileTemporaryPath
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=asynchronous, cleanup_tmp_directories=not read_only,
        **bucket_options)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_handlers=_item_handlers())

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any, data_iterator=None, *, force: bool = False) -> bool:
    """Starts saving (asynchronously); the data iterator's position is taken now."""
    items = {"state": ocp.args.PyTreeSave(state)}
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
    problems = []
    reader = ocp.CompositeCheckpointHandler(**_item_handlers())
    try:
      for step in reversed(steps):
        state, own = self._read(reader, step, abstract_state, data_iterator)
        failed = {i: p for i, p in enumerate(distributed.each_process(own)) if p}
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
      storage.forget_listings(self.directory)  # A bucket's listing from before the renames.
    self.manager.reload()

  def restore_params(self, step: int, abstract_params: Any) -> Any:
    """Only the parameters of the checkpoint at `step` (no optimizer state)."""
    target = {"params": abstract_params}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args,
                                     partial_restore=True)))
    return restored["state"]["params"]


def _item_handlers() -> dict:
  return {"state": ocp.PyTreeCheckpointHandler(), "data": grain.checkpoint.CheckpointHandler()}


def _tensorstore_reaches_s3() -> None:
  """Has orbax hand s3:// checkpoint directories to TensorStore's S3 driver.

  orbax (0.12) builds TensorStore specs for local paths and gs:// only
  (`tensorstore_utils.build_kvstore_tspec`), and would take s3://B/P for a relative
  local path. The wrapper asks orbax for the spec of gs://B/P, which keeps its format
  (OCDBT per process, write options, read coalescing), and swaps the GCS store for
  the S3 one (`storage.s3_kvstore`).
  """
  try:  # orbax's internals: a version without them says so instead of writing elsewhere.
    from orbax.checkpoint._src.serialization import tensorstore_utils

    build = tensorstore_utils.build_kvstore_tspec
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"s3:// checkpoints need orbax-checkpoint's tensorstore_utils."
                      f"build_kvstore_tspec, which orbax-checkpoint {ocp.__version__} lacks "
                      f"({e}); use a gs:// or local workdir, or orbax-checkpoint 0.12") from None
  if getattr(build, "reaches_s3", False):
    return

  def for_s3(gcs_store: dict) -> dict:
    rest = {k: v for k, v in gcs_store.items() if k not in ("driver", "bucket", "path")}
    return {**rest, **storage.s3_kvstore(f"s3://{gcs_store['bucket']}/{gcs_store['path']}")}

  def build_with_s3(directory, *args, **kwargs):
    directory = str(directory)
    if not directory.startswith("s3://"):
      return build(directory, *args, **kwargs)
    spec = build("gs://" + directory.removeprefix("s3://"), *args, **kwargs)
    if spec.get("driver") == "ocdbt":
      return {**spec, "base": for_s3(spec["base"])}
    return for_s3(spec)

  build_with_s3.reaches_s3 = True
  tensorstore_utils.build_kvstore_tspec = build_with_s3


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return text[0][:300] if text else ""


def abstract_params(model_config: TransformerConfig):
  """Shapes and dtypes of the model's parameters (nothing allocated)."""
  dummy = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(model_config).init(
      jax.random.PRNGKey(0), dummy, dummy)["params"])
  return nn.unbox(shapes)


def average_params(checkpointer: Checkpointer, steps: Sequence[int], abstract: Any):
  """Element-wise mean of the parameters at `steps` (paper: last 5 or 20 checkpoints)."""
  if not steps:
    raise CheckpointError(f"no checkpoints to average in {checkpointer.directory}")
  total = None
  for step in steps:
    params = checkpointer.restore_params(step, abstract)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
    total = params if total is None else jax.tree_util.tree_map(jnp.add, total, params)
  scale = np.float32(1.0 / len(steps))
  return jax.tree_util.tree_map(lambda x, a: (x * scale).astype(a.dtype), total, abstract)


def load_params(workdir: str | Path, model_config: TransformerConfig, *,
                checkpoint_step: int | None = None, average_last: int = 1,
                flag: str = "--average_last"):
  """(parameters, steps): a workdir's checkpoint, or the mean of its last `average_last`.

  flag: what the caller's user calls `average_last`, named when it is below 1 (the
  one check decode.py, export.py, average_checkpoints.py and Translator share).
  """
  if average_last < 1:
    raise ConfigError(f"{flag} must be at least 1 (how many of the newest checkpoints to "
                      f"average; 1 = the newest alone), got {average_last}")
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    return _load_params(checkpointer, model_config, checkpoint_step, average_last)
  finally:
    checkpointer.close()


def _load_params(checkpointer: Checkpointer, model_config: TransformerConfig,
                 checkpoint_step: int | None, average_last: int):
  steps = checkpointer.steps()
  if not steps:
    raise CheckpointError(f"no checkpoint in {checkpointer.directory}")
  if checkpoint_step is not None:
    if checkpoint_step not in steps:
      raise CheckpointError(f"no checkpoint of step {checkpoint_step} in "
                            f"{checkpointer.directory}; steps: {steps}")
    chosen = [s for s in steps if s <= checkpoint_step][-average_last:]
  else:
    chosen = steps[-average_last:]
  if len(chosen) < average_last:
    logging.warning("Averaging %d checkpoints (%s): fewer than the %d asked for",
                    len(chosen), chosen, average_last)
  target = abstract_params(model_config)
  if len(chosen) == 1:
    return checkpointer.restore_params(chosen[0], target), chosen
  return average_params(checkpointer, chosen, target), chosen


def write_averaged(workdir: str | Path, output: str | Path, last: int) -> list[int]:
  """A new workdir whose one checkpoint is the mean of `workdir`'s last `last` ones.

  run.json and the vocabulary are copied, so decode.py (and Translator) use the
  result like any workdir. Returns the averaged steps. If writing fails, `output` is
  left as it was found (absent or empty): a run.json without its checkpoint would pass
  for a workdir.
  """
  workdir, output = Workdir(workdir), Workdir(output)
  existed = output.root.exists()
  if existed and any(output.root.iterdir()):
    raise CheckpointError(f"output {output} exists and is not empty: choose a new directory")
  model_config, _ = read_run(workdir)
  params, steps = load_params(workdir, model_config, average_last=last, flag="--last")
  try:
    output.root.mkdir(parents=True, exist_ok=True)
    for name in ("run_file", "vocab_file"):
      storage.copy_file(getattr(workdir, name), getattr(output, name))
    writer = Checkpointer(output, asynchronous=False)
    try:
      writer.save(steps[-1], {"params": params}, force=True)
      writer.wait()
    finally:
      writer.close()
  except BaseException as e:
    for child in output.root.iterdir() if output.root.exists() else ():
      _remove(child)
    if not existed and output.root.exists():
      _remove(output.root)
    if isinstance(e, OSError):  # Copying run.json or the vocabulary.
      raise CheckpointSaveError(f"writing {output} failed ({e.strerror or e}); is the disk full "
                                "or the directory unwritable? It is left as it was") from None
    raise
  return steps


def _remove(path) -> None:
  """Deletes a file or a whole folder, local or in a bucket."""
  if storage.is_remote(path):
    path.rmtree() if path.is_dir() else path.unlink()
  elif path.is_dir():
    shutil.rmtree(path)
  else:
    path.unlink()
