"""The workdir: what a run leaves on disk, written, checked and read here alone.

  <workdir>/run.json        the model config and vocabulary size (RUN_FILE)
  <workdir>/vocab.model     the shared sentencepiece vocabulary (VOCAB_FILE)
  <workdir>/checkpoints/    orbax checkpoints of state and data iterator (CHECKPOINT_DIR)
  <workdir>/metrics.jsonl   one JSON object per logged step (METRICS_FILE)
  <workdir>/tensorboard/    TensorBoard event files

Training records the run (`record_run`) and checks the directory is still there
(`check_present`); translation reads it back (`read_run`, `load_params`, with the
paper's checkpoint averaging); `write_averaged` makes a workdir of one averaged
checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.data.tokenizer import Tokenizer
from flax_transformer.data.tokenizer import VOCAB_FILENAME as VOCAB_FILE
from flax_transformer.errors import (CheckpointError, ConfigError, WorkdirGoneError,
                                     WorkdirWriteError)
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.model import Transformer
from flax_transformer.training.checkpoints import CHECKPOINT_DIR, Checkpointer
from flax_transformer.training.metrics import METRICS_FILE

RUN_FILE = "run.json"
__all__ = ["RUN_FILE", "VOCAB_FILE", "CHECKPOINT_DIR", "METRICS_FILE", "record_run",
           "check_present", "read_run", "abstract_params", "average_params", "load_params",
           "write_averaged"]
# Model fields that may differ between runs sharing a workdir (they change no parameter).
MUTABLE_MODEL_FIELDS = {"dropout_rate", "attention_dropout_rate", "deterministic", "decode",
                        "share_beam_cache", "dtype", "attention_implementation"}


def record_run(workdir: Path, model_config: TransformerConfig, vocab_size: int,
               launch: dict | None = None) -> None:
  """Writes run.json, or refuses a workdir whose run.json holds a different model.

  `launch` (the config file, overrides, full config, commit, packages, machine of
  this start) is appended to the record's `launches`: one entry per start or resume.
  """
  record = {"model": model_config.to_dict(), "vocab_size": vocab_size, "launches": []}
  path = Path(workdir) / RUN_FILE
  previous = json.loads(path.read_text()) if path.exists() else None
  if previous is None:
    record["launches"] = [launch] if launch else []
    _replace(path, json.dumps(record, indent=1, default=str))
    return
  differences = [f"model.{k}: workdir has {v!r}, config has {record['model'].get(k)!r}"
                 for k, v in previous["model"].items()
                 if k not in MUTABLE_MODEL_FIELDS and record["model"].get(k) != v]
  if previous.get("vocab_size") != vocab_size:
    differences.append(f"vocabulary size: workdir has {previous.get('vocab_size')}, "
                       f"now {vocab_size}")
  if differences:
    raise ConfigError(f"{workdir} holds a run with a different model: " + "; ".join(differences)
                      + ". Use a new --workdir, or the workdir's values.")
  if launch:
    previous.setdefault("launches", []).append(launch)
    _replace(path, json.dumps(previous, indent=1, default=str))


def _replace(path: Path, text: str) -> None:
  """Writes `path` whole or not at all: a full disk must not leave a cut record."""
  partial = path.with_name(path.name + ".partial")
  try:
    partial.write_text(text)
    os.replace(partial, path)
  except OSError as e:
    partial.unlink(missing_ok=True)
    raise WorkdirWriteError(f"writing {path} failed ({e.strerror or e}); is the disk full or "
                            "the directory unwritable? The previous record, if any, is "
                            "intact") from None


def check_present(workdir: Path, step: int) -> None:
  """Stops a run whose workdir vanished, before anything is written into a stray copy.

  Orbax and the metrics writer would otherwise go on: checkpoints land in a
  re-created directory without run.json or the vocabulary, and metrics go to a
  deleted file, all silently.
  """
  if jax.process_index() == 0 and not (Path(workdir) / RUN_FILE).is_file():
    raise WorkdirGoneError(
        f"workdir {workdir} was deleted or replaced while training ({Path(workdir) / RUN_FILE} "
        f"is gone): stopped at step {step} without writing its metrics or checkpoint. Restore "
        "the directory to resume, or start again with a new --workdir")


def read_run(workdir: str | Path) -> tuple[TransformerConfig, Tokenizer]:
  """The model config and vocabulary a workdir was trained with."""
  workdir = Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"workdir {workdir} does not exist")
  run_file = workdir / RUN_FILE
  if not run_file.is_file():
    raise FileNotFoundError(f"{run_file} not found: {workdir} is not a training workdir "
                            "(train.py writes it)")
  model = json.loads(run_file.read_text())["model"]
  # Records written before `attention_bias` existed describe models trained with
  # those biases: without this their checkpoints would not load.
  model.setdefault("attention_bias", True)
  model_config = TransformerConfig.from_dict(model)
  return model_config, Tokenizer(workdir / VOCAB_FILE)


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
                checkpoint_step: int | None = None, average_last: int = 1):
  """(parameters, steps): a workdir's checkpoint, or the mean of its last `average_last`."""
  checkpointer = Checkpointer(workdir, read_only=True)
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
  result like any workdir. Returns the averaged steps.
  """
  workdir, output = Path(workdir), Path(output)
  if output.exists() and any(output.iterdir()):
    raise CheckpointError(f"output {output} exists and is not empty: choose a new directory")
  model_config, _ = read_run(workdir)
  params, steps = load_params(workdir, model_config, average_last=last)
  output.mkdir(parents=True, exist_ok=True)
  for name in (RUN_FILE, VOCAB_FILE):
    shutil.copy2(workdir / name, output / name)
  writer = Checkpointer(output, asynchronous=False)
  writer.save(steps[-1], {"params": params}, force=True)
  writer.wait()
  writer.close()
  return steps
