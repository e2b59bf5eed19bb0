"""A run's directory: the one place that knows where each of its files lives, and its record.

  <workdir>/run.json        the model config, vocabulary size and every launch (RUN_FILE)
  <workdir>/vocab.model     the shared sentencepiece vocabulary (VOCAB_FILE)
  <workdir>/tokenizer/      an imported model's tokenizer files instead (TOKENIZER_DIR;
                            run.json's "tokenizer" entry names them: data.tokenizer_kinds)
  <workdir>/checkpoints/    orbax checkpoints of state and data iterator (CHECKPOINT_DIR)
  <workdir>/metrics.jsonl   one JSON object per logged step (METRICS_FILE; local workdirs)
  <workdir>/metrics/        the same lines in a bucket, one object per flush (METRICS_DIR)
  <workdir>/tensorboard/    TensorBoard event files (TENSORBOARD_DIR)
  <workdir>/profile/        jax.profiler traces, when asked for (PROFILE_DIR)
  <workdir>/launch.lock     the running launch, while it runs (LOCK_FILE: launch_lock)

`Workdir(path)` names them, in a local directory or a bucket (gs://, s3://: see
`storage`); the modules that write and read each file (checkpoints,
training.metrics, the tokenizer, the loop's profiler) ask it for the path. Training
records the run (`record_run`) and checks the directory is still there
(`check_present`); translation reads it back (`read_run`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import jax

from flax_transformer import languages as languages_lib
from flax_transformer import provenance, storage
from flax_transformer.data import tokenizer_kinds
from flax_transformer.data.tokenizer import Tokenizer
from flax_transformer.errors import (ConfigError, DataError, WorkdirGoneError,
                                     WorkdirWriteError)
from flax_transformer.languages import Languages
from flax_transformer.network.config import TransformerConfig

RUN_FILE = "run.json"
VOCAB_FILE = "vocab.model"
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
METRICS_DIR = "metrics"
TENSORBOARD_DIR = "tensorboard"
PROFILE_DIR = "profile"
LOCK_FILE = "launch.lock"
# Every entry above: what a tool writing beside a run must never replace (export.py).
ENTRIES = (RUN_FILE, VOCAB_FILE, TOKENIZER_DIR, CHECKPOINT_DIR, METRICS_FILE, METRICS_DIR,
           TENSORBOARD_DIR, PROFILE_DIR, LOCK_FILE)


@dataclasses.dataclass(frozen=True)
class Workdir:
  """Where each file of the run in `root` (a directory or a bucket's prefix) lives."""

  root: Path  # Or an epath.Path, for a bucket.

  def __init__(self, root: str | os.PathLike | Workdir):
    root = root.root if isinstance(root, Workdir) else storage.as_path(root)
    object.__setattr__(self, "root", root if storage.is_remote(root) else root.absolute())

  def __str__(self) -> str:
    return str(self.root)

  def __fspath__(self) -> str:
    return str(self.root)

  run_file = property(lambda self: self.root / RUN_FILE)
  vocab_file = property(lambda self: self.root / VOCAB_FILE)
  tokenizer_dir = property(lambda self: self.root / TOKENIZER_DIR)
  checkpoints = property(lambda self: self.root / CHECKPOINT_DIR)
  metrics_file = property(lambda self: self.root / METRICS_FILE)
  metrics_dir = property(lambda self: self.root / METRICS_DIR)
  tensorboard = property(lambda self: self.root / TENSORBOARD_DIR)
  profile = property(lambda self: self.root / PROFILE_DIR)
  lock_file = property(lambda self: self.root / LOCK_FILE)


# Model fields a run may set for itself: they change no parameter's shape or meaning, so a
# resumed run (and a fine-tuning one, training.init_from) takes them from its config.
MUTABLE_MODEL_FIELDS = {"dropout_rate", "attention_dropout_rate", "deterministic", "decode",
                        "share_beam_cache", "dtype", "attention_implementation"}


def record_run(workdir: str | os.PathLike, model_config: TransformerConfig, vocab_size: int,
               launch: dict | None = None, entries: dict | None = None) -> None:
  """Writes run.json, or refuses a workdir whose run.json holds a different model.

  `launch` (the config file, overrides, full config, commit, packages, machine of
  this start) is appended to the record's `launches`: one entry per start or resume.
  `entries`: more of a new record (a fine-tuning run's `init_from`, the checkpoint it
  started from, and its source's `tokenizer_entries`), kept as they are by later launches.
  """
  record = {"model": model_config.to_dict(), "vocab_size": vocab_size, "launches": []}
  path = Workdir(workdir).run_file
  previous = read_record(workdir)
  if previous is None:
    record.update(entries or {})
    record["launches"] = [launch] if launch else []
    _write_record(path, record)
    return
  differences = [f"model.{k}: workdir has {v!r}, config has {record['model'].get(k)!r}"
                 for k, v in recorded_model(previous).items()
                 if k not in MUTABLE_MODEL_FIELDS and record["model"].get(k) != v]
  if previous.get("vocab_size") != vocab_size:
    differences.append(f"vocabulary size: workdir has {previous.get('vocab_size')}, "
                       f"now {vocab_size}")
  if differences:
    raise ConfigError(f"{workdir} holds a run with a different model: " + "; ".join(differences)
                      + ". Use a new --workdir, or the workdir's values.")
  if launch:
    previous.setdefault("launches", []).append(launch)
    _write_record(path, previous)


def recorded_model(record: dict) -> dict:
  """A run record's model fields as its checkpoints were trained: a field added since the
  record was written takes the value that kept the old function (attention_bias: True,
  the biases it had before the field; any other: its default)."""
  return {**TransformerConfig().to_dict(), "attention_bias": True, **record["model"]}


def read_record(workdir: str | os.PathLike) -> dict | None:
  """A workdir's run.json as written (None when it has none)."""
  path = Workdir(workdir).run_file
  return _parse_record(path) if path.exists() else None


def _parse_record(run_file) -> dict:
  """run.json's object, or a DataError naming the file when it holds none (cut short by
  a full disk, edited, or another program's)."""
  try:
    record = json.loads(run_file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f"{run_file}: not JSON ({e})") from None
  if not isinstance(record, dict):
    raise DataError(f"{run_file}: not a run record (a JSON object), but a "
                    f"{type(record).__name__}")
  return record


def record_launch(workdir: Workdir, model_config: TransformerConfig, vocab_size: int,
                  launch: dict, entries: dict | None = None) -> None:
  """`record_run` with this launch's code, packages and machine added to `launch`
  (process 0's); warns when the checkout has uncommitted changes."""
  code = provenance.describe(jax.devices())
  if code.get("git_dirty"):
    logging.warning("The checkout has uncommitted changes to %s: this launch records their "
                    "diff in %s (launches[-1].git_diff) beside commit %s. Commit before a "
                    "run you will report.", ", ".join(code["git_dirty_files"]),
                    workdir.run_file, code["git_commit"][:7])
  entries = dict(entries or {})
  stated = languages_lib.from_config(launch.get("config") or {})
  if stated is not None and "languages" not in entries:  # A run of its own: its data's.
    entries["languages"] = stated.to_json()
  record_run(workdir, model_config, vocab_size, launch={**launch, **code}, entries=entries)


def _write_record(path, record: dict) -> None:
  try:
    storage.write_atomically(path, json.dumps(record, indent=1, default=str))
  except OSError as e:
    raise WorkdirWriteError(f"writing {path} failed ({e.strerror or e}); is the disk full or "
                            "the directory unwritable? The previous record, if any, is "
                            "intact") from None


def check_present(workdir: str | os.PathLike, step: int) -> None:
  """Stops a run whose workdir vanished, before anything is written into a stray copy.

  Orbax and the metrics writer would otherwise go on: checkpoints land in a
  re-created directory without run.json or the vocabulary, and metrics go to a
  deleted file, all silently.
  """
  run_file = Workdir(workdir).run_file
  if jax.process_index() == 0 and not run_file.is_file():
    raise WorkdirGoneError(
        f"workdir {workdir} was deleted or replaced while training ({run_file} "
        f"is gone): stopped at step {step} without writing its metrics or checkpoint. Restore "
        "the directory to resume, or start again with a new --workdir")


def tokenizer_files(workdir: str | os.PathLike) -> tuple[str, ...]:
  """The names of the files in `workdir` that its tokenizer reads: what a workdir made
  from it (fine-tuning) copies beside its own run.json."""
  spec = (read_record(workdir) or {}).get("tokenizer")
  if spec is None:  # A run trained here: one shared vocabulary.
    return (VOCAB_FILE,)
  return tuple(f"{TOKENIZER_DIR}/{name}" for name in spec["files"])


def tokenizer_entries(record: dict) -> dict:
  """The entries of a run record that describe its tokenizer and languages, besides
  `vocab_size`: what a
  workdir made from it (fine-tuning) records too."""
  return {key: record[key] for key in ("tokenizer", "languages") if key in record}


def languages(workdir: str | os.PathLike) -> Languages:
  """What a workdir's model translates between (languages.Languages): run.json's
  "languages", else (a workdir written before it) its one pair: the last launch's data
  config, an imported FSMT tokenizer's langs, an OPUS-MT vocabulary's >>xx<< tags."""
  record = read_record(workdir) or {}
  pieces = None
  spec = record.get("tokenizer") or {}
  if "languages" not in record and spec.get("kind") == "marian":
    path = Workdir(workdir).tokenizer_dir / "vocab.json"
    pieces = json.loads(path.read_text()) if path.is_file() else None
  return languages_lib.from_record(record, pieces)


def language_pair(workdir: str | os.PathLike) -> tuple[str, str] | None:
  """(source, target) of a one-pair workdir's model; None when it states no pair or
  knows more than one."""
  known = languages(workdir)
  pairs = known.pairs()
  return pairs[0] if len(pairs) == 1 else None


def read_run(workdir: str | Path) -> tuple[TransformerConfig, Tokenizer]:
  """The model config and vocabulary a workdir was trained with."""
  workdir = Workdir(workdir)
  if not workdir.root.is_dir():
    raise FileNotFoundError(f"workdir {workdir} does not exist")
  run_file = workdir.run_file
  if not run_file.is_file():
    raise FileNotFoundError(f"{run_file} not found: {workdir} is not a training workdir "
                            "(train.py writes it)")
  model_config, record = _read_model(run_file)
  if "tokenizer" in record:  # An imported model's (import_model.py).
    tokenizer = tokenizer_kinds.load(workdir.tokenizer_dir, record["tokenizer"])
  else:
    tokenizer = Tokenizer(workdir.vocab_file)
  check_vocabulary_sizes(model_config, tokenizer, run_file)
  return model_config, tokenizer


def _read_model(run_file) -> tuple[TransformerConfig, dict]:
  """(the model config, the whole record) of run.json, or a DataError naming the file
  when it is not one (cut short by a full disk, edited, or of another program)."""
  record = _parse_record(run_file)
  if not isinstance(record.get("model"), dict):
    raise DataError(f'{run_file}: not a run record: no "model" object (the model\'s settings)')
  try:
    return TransformerConfig.from_dict(recorded_model(record)), record
  except (ConfigError, DataError):
    raise
  except (TypeError, ValueError) as e:
    raise DataError(f'{run_file}: its "model" record is not a valid model ({e})') from None


def check_vocabulary_sizes(model_config: TransformerConfig, tokenizer, run_file) -> None:
  """DataError unless each side of `tokenizer` (`source`/`target`, or one shared
  vocabulary) has as many pieces as the model's embedding it feeds (run.json's): files
  of another model's tokenizer would otherwise translate into garbage, exit 0."""
  for side, size in (("source", model_config.source_vocab), ("target", model_config.vocab_size)):
    pieces = getattr(tokenizer, side, tokenizer).vocab_size
    if pieces != size:
      where = getattr(tokenizer, "path", "its files")
      raise DataError(f"{run_file}: the model's {side} vocabulary has {size} entries but "
                      f"the tokenizer's ({where}) has {pieces}: its files are another "
                      "model's; import or train into a new workdir")
