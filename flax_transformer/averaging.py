"""The paper's checkpoint averaging (section 6.1: the last 5 or 20 checkpoints): a
workdir's parameters as the mean of its newest checkpoints (`load_params`), or written
as a workdir of their own (`write_averaged`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer import storage
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.errors import CheckpointError, CheckpointSaveError, ConfigError
from flax_transformer.network.config import TransformerConfig
from flax_transformer.pretrained import tokenizers as _kinds  # noqa: F401  (registers the imported tokenizers' kinds)
from flax_transformer.network.model import abstract_params  # Also this module's name.
from flax_transformer.workdir import RUN_FILE, Workdir, read_run, tokenizer_files


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


DEFAULT_AVERAGE_LAST = 5  # The paper's base-model recipe (section 6.1).


def check_average_last(average_last: int | None, flag: str = "--average_last") -> None:
  if average_last is not None and average_last < 1:
    raise ConfigError(f"{flag} must be at least 1 (how many of the newest checkpoints to "
                      f"average; 1 = the newest alone), got {average_last}")


def load_params(workdir: str | Path, model_config: TransformerConfig, *,
                checkpoint_step: int | None = None, average_last: int | None = 1,
                flag: str = "--average_last"):
  """(parameters, steps): a workdir's checkpoint, or the mean of its last `average_last`.

  average_last: a number the user asked for (a warning where the workdir holds fewer),
  or None: the default, the last DEFAULT_AVERAGE_LAST or as many as there are, quietly
  (an imported model's one checkpoint is no shortfall).
  flag: what the caller's user calls `average_last`, named when it is below 1 (the
  one check decode.py, export.py, average_checkpoints.py and Translator share).
  """
  check_average_last(average_last, flag)
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    return _load_params(checkpointer, model_config, checkpoint_step, average_last)
  finally:
    checkpointer.close()


def _load_params(checkpointer: Checkpointer, model_config: TransformerConfig,
                 checkpoint_step: int | None, average_last: int | None):
  asked = average_last is not None
  average_last = average_last if asked else DEFAULT_AVERAGE_LAST
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
  if asked and len(chosen) < average_last:
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
    for name in (RUN_FILE, *tokenizer_files(workdir)):
      storage.copy_file(workdir.root / name, output.root / name)
    writer = Checkpointer(output, asynchronous=False)
    try:
      writer.save(steps[-1], {"params": params}, force=True)
      writer.wait()
    finally:
      writer.close()
  except BaseException as e:
    for child in output.root.iterdir() if output.root.exists() else ():
      storage.remove(child)
    if not existed and output.root.exists():
      storage.remove(output.root)
    if isinstance(e, OSError):  # Copying run.json or the vocabulary.
      raise CheckpointSaveError(f"writing {output} failed ({e.strerror or e}); is the disk full "
                                "or the directory unwritable? It is left as it was") from None
    raise
  return steps
