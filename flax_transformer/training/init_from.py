"""Fine-tuning (`config.init_from`): a run that starts from another workdir's checkpoint.

The run keeps the source's model config (its run.json's; of `config.model`, only the
per-run fields, `workdir.MUTABLE_MODEL_FIELDS`, apply) and its vocabulary (the tokenizer
files its record names, copied into the new workdir; none is trained). The optimizer
state is new (step 0: the warmup starts again), and the data is the run's own config's.
The new run.json records `init_from`: the source workdir and the step of its checkpoint.

Every later launch on that workdir, with the same `init_from` (a preempted job's
identical relaunch) or without one, goes on with the run: from its own checkpoints,
or, before its first, from the recorded source checkpoint again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

from flax_transformer import storage
from flax_transformer import workdir as workdir_lib
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.errors import ConfigError
from flax_transformer.languages import Languages, from_record
from flax_transformer.network.config import TransformerConfig
from flax_transformer.pretrained import tokenizers as _kinds  # noqa: F401  (registers the imported tokenizers' kinds)
from flax_transformer.training.config_checks import model_config_from
from flax_transformer.workdir import Workdir

PER_RUN_MODEL_FIELDS = workdir_lib.MUTABLE_MODEL_FIELDS


@dataclasses.dataclass(frozen=True)
class FineTuning:
  """Where a fine-tuning run starts from, and what it keeps of it."""

  source: Workdir  # The workdir whose checkpoint the run starts from.
  step: int  # That checkpoint's step.
  model_config: TransformerConfig  # The source's, with this launch's per-run fields.
  tokenizer: Any  # data.tokenizer.Tokenizer, or an imported model's (pretrained.tokenizers).
  # run.json of where the model config and tokenizer were read: the source's at a start,
  # the run's own when it resumes (its source may be gone by then).
  origin_record: dict
  resuming: bool  # The run has checkpoints of its own: it goes on from those.

  @property
  def vocab_size(self) -> int:
    return self.origin_record["vocab_size"]

  @property
  def languages(self) -> Languages:
    """The model's languages record: a multilingual fine-tuning's config.languages names
    them, its data marked with their tokens (data.multilingual.of_model)."""
    return from_record(self.origin_record)

  def record_entries(self) -> dict:
    """What the run's run.json records besides a run of its own: `init_from` (the source
    and the step of its checkpoint) and the source's tokenizer entries."""
    return {"init_from": {"workdir": str(self.source), "step": self.step},
            **workdir_lib.tokenizer_entries(self.origin_record)}


def resolve(config, workdir: Workdir, overrides: Mapping | None = None) -> FineTuning | None:
  """What this launch is: None for a run of its own; otherwise a fine-tuning run's start
  (`config.init_from` asked for it) or relaunch (its run.json records it).

  overrides: the launch's `--config.KEY` overrides (flat, as ml_collections gives them);
  one of `model.*` other than PER_RUN_MODEL_FIELDS, or of `vocab_size`, that differs from
  the source's model is refused, as is `vocab_path`. Raises ConfigError, naming the key.
  """
  record = workdir_lib.read_record(workdir)
  recorded = (record or {}).get("init_from")
  asked = str(Workdir(config.init_from)) if config.init_from else None
  if asked is None and recorded is None:
    if record is not None and "imported_from" in record:  # Before a vocabulary is trained.
      raise ConfigError(f"{workdir} holds a model import_model.py imported; fine-tune it into "
                        f"a new --workdir with --config.init_from={workdir}")
    return None
  own_steps = _steps(workdir)
  if asked is not None:
    started = f"; started from {recorded['workdir']}" if recorded else ""
    if own_steps and (recorded is None or recorded["workdir"] != asked):
      raise ConfigError(
          f"config.init_from: {workdir} already has checkpoints (steps {own_steps[0]}.."
          f"{own_steps[-1]}{started}): resume it instead, without --config.init_from, or "
          "train into a new --workdir")
    if record is not None and recorded is None:
      raise ConfigError(f"config.init_from: {workdir} already holds a run of its own "
                        f"({workdir.run_file}); fine-tune into a new --workdir")
    if recorded is not None and recorded["workdir"] != asked:
      raise ConfigError(f"config.init_from={asked}: {workdir} was started from "
                        f"{recorded['workdir']}; relaunch with that, or without init_from, "
                        "or fine-tune into a new --workdir")
  if config.vocab_path:
    raise ConfigError(f"config.vocab_path={config.vocab_path!r}: a run with init_from keeps "
                      "its source's vocabulary; leave vocab_path empty")
  if own_steps:  # Resuming: the run's own record and vocabulary, even if its source is gone.
    source, step, origin = Workdir(recorded["workdir"]), int(recorded["step"]), workdir
    model, tokenizer = workdir_lib.read_run(workdir)
  else:
    source = origin = Workdir(asked or recorded["workdir"])
    model, tokenizer = _read_source(source)
    step = _source_step(source, None if recorded is None else int(recorded["step"]))
  if config.subword_sampling_alpha > 0 and not hasattr(tokenizer, "tokenize_sampled"):
    raise ConfigError(f"config.subword_sampling_alpha={config.subword_sampling_alpha}: the "
                      f"tokenizer of {source} cannot sample segmentations; set it to 0")
  model = _run_model(model, config, overrides or {}, source)
  return FineTuning(source, step, model, tokenizer, workdir_lib.read_record(origin),
                    resuming=bool(own_steps))


def _steps(workdir: Workdir) -> list[int]:
  if not workdir.checkpoints.exists():
    return []
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    return checkpointer.steps()
  finally:
    checkpointer.close()


def _read_source(source: Workdir) -> tuple[TransformerConfig, Any]:
  try:
    return workdir_lib.read_run(source)
  except FileNotFoundError as e:
    raise ConfigError(f"config.init_from: {e}") from None


def _source_step(source: Workdir, recorded: int | None) -> int:
  """The source checkpoint a start uses: its newest, or the one the record names (a
  relaunch before the run's first checkpoint starts where the first launch did)."""
  steps = _steps(source)
  if not steps:
    raise ConfigError(f"config.init_from: {source} has no checkpoint ({source.checkpoints} "
                      "is empty or missing): train or import it first")
  if recorded is None:
    return steps[-1]
  if recorded not in steps:
    raise ConfigError(f"config.init_from: {source} no longer has the checkpoint of step "
                      f"{recorded} this run started from (steps: {steps})")
  return recorded


def _run_model(source_model: TransformerConfig, config, overrides: Mapping,
               source: Workdir) -> TransformerConfig:
  """The source's model config with this launch's per-run fields; refuses an override
  that contradicts the source."""
  launch_model = model_config_from(config)
  asked, have = launch_model.to_dict(), source_model.to_dict()
  contradicting = [f"--config.{key}={asked[field]!r} (the source's: {have[field]!r})"
                   for key in overrides
                   for field in [_model_field(key)]
                   if field and field not in PER_RUN_MODEL_FIELDS and asked[field] != have[field]]
  if contradicting:
    raise ConfigError(f"config.init_from={source} fixes the model config: "
                      + ", ".join(contradicting) + " contradicts it. Per-run fields only ("
                      + ", ".join(sorted(PER_RUN_MODEL_FIELDS)) + ") may differ")
  return source_model.replace(**{f: getattr(launch_model, f) for f in PER_RUN_MODEL_FIELDS})


def _model_field(key: str) -> str | None:
  """The model field an override sets: `model.X` -> X, `vocab_size` -> vocab_size."""
  if key == "vocab_size":
    return key
  return key[len("model."):] if key.startswith("model.") else None


def copy_tokenizer(fine_tuning: FineTuning, workdir: Workdir) -> None:
  """Copies the source's tokenizer files into the new run's workdir (a start, process 0)."""
  for name in workdir_lib.tokenizer_files(fine_tuning.source):
    (workdir.root / name).parent.mkdir(parents=True, exist_ok=True)
    storage.copy_file(fine_tuning.source.root / name, workdir.root / name)


def initial_state(trainer, fine_tuning: FineTuning):
  """The run's step-0 state: the source checkpoint's parameters, placed as the trainer's,
  and a new optimizer state."""
  checkpointer = Checkpointer(fine_tuning.source, read_only=True)
  try:
    params = checkpointer.restore_params(
        fine_tuning.step, trainer.abstract_state.params,
        fix="config.init_from needs a checkpoint that loads; check or replace the source")
  finally:
    checkpointer.close()
  logging.info("Fine-tuning from %s, checkpoint step %d: new optimizer state, step 0",
               fine_tuning.source, fine_tuning.step)
  return trainer.state_from_params(params)
