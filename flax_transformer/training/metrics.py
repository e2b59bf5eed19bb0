"""Where training metrics go: TensorBoard and `metrics.jsonl` (process 0 only).

clu's metric writers would be the natural choice, but `clu.metric_writers`
imports TensorFlow when imported; this project has no TensorFlow dependency,
so TensorBoard files are written through tensorboardX behind the same
`write_scalars(step, scalars)` interface.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from typing import Any, Mapping, Sequence

import numpy as np

from flax_transformer import storage
from flax_transformer.workdir import Workdir


def _plain(value: Any):
  value = np.asarray(value).item() if np.ndim(value) == 0 else np.asarray(value).tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/inf; keep the fact, as a string.
  return value


class JsonlWriter:
  """Appends one JSON object per `write_scalars` call: {"step": s, **scalars}.

  A local file is opened for appending, so a resumed run continues it. An object in
  a bucket cannot be appended to: its text so far is kept and the object replaced
  whole at each flush (one line per logged step: small).
  """

  def __init__(self, path: str | os.PathLike):
    self.path = storage.as_path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if storage.is_remote(self.path):
      self._text = self.path.read_text() if self.path.exists() else ""
      self._file = None
    else:
      self._file = open(self.path, "a", encoding="utf-8")

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    record = {"step": int(step), **{k: _plain(v) for k, v in scalars.items()}}
    if self._file is None:
      self._text += json.dumps(record) + "\n"
    else:
      self._file.write(json.dumps(record) + "\n")

  def flush(self) -> None:
    if self._file is None:
      storage.write_whole(self.path, self._text)
    else:
      self._file.flush()

  def close(self) -> None:
    if self._file is None:
      self.flush()
    else:
      self._file.close()


class TensorBoardWriter:
  """TensorBoard event files through tensorboardX (no TensorFlow needed).

  For a logdir in a bucket the events go to a local directory first and each flush
  uploads its files whole (tensorboardX's own bucket writers need TensorFlow's or
  boto's file layers, and fail without them).
  """

  def __init__(self, logdir: str | os.PathLike):
    from tensorboardX import SummaryWriter

    self.logdir = storage.as_path(logdir)
    self._local = storage.local_dir_for(self.logdir, prefix="tensorboard-")
    # Event files are named by the second and host: a launch's own suffix keeps a quick
    # relaunch from replacing the last one's upload.
    self._writer = SummaryWriter(self._local, filename_suffix=(
        f".{uuid.uuid4().hex[:8]}" if storage.is_remote(self.logdir) else ""))

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for key, value in scalars.items():
      self._writer.add_scalar(key, float(np.asarray(value)), global_step=int(step))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._writer.add_text("hparams", json.dumps(dict(hparams), default=str, indent=1))

  def flush(self) -> None:
    self._writer.flush()
    storage.upload_tree(self._local, self.logdir)

  def close(self) -> None:
    self._writer.close()
    storage.upload_tree(self._local, self.logdir)
    if storage.is_remote(self.logdir):
      shutil.rmtree(self._local, ignore_errors=True)


class MultiWriter:
  """Sends every call to each writer."""

  def __init__(self, writers: Sequence[Any]):
    self.writers = list(writers)

  def write_scalars(self, step, scalars):
    for w in self.writers:
      w.write_scalars(step, scalars)

  def write_hparams(self, hparams):
    for w in self.writers:  # metrics.jsonl holds none: run.json records the model.
      if hasattr(w, "write_hparams"):
        w.write_hparams(hparams)

  def flush(self):
    for w in self.writers:
      w.flush()

  def close(self):
    for w in self.writers:
      w.close()


def create_writer(workdir: str | os.PathLike, process_index: int = 0) -> MultiWriter:
  """Process 0 writes TensorBoard and metrics.jsonl; other processes write nothing."""
  if process_index != 0:
    return MultiWriter([])
  workdir = Workdir(workdir)
  return MultiWriter([JsonlWriter(workdir.metrics_file), TensorBoardWriter(workdir.tensorboard)])


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """The logged steps of every run in `workdir` so far, oldest first; a line cut by a
  crash is skipped (the rest of the file still counts)."""
  path = Workdir(workdir).metrics_file
  records = []
  if path.exists():
    for line in path.read_text(encoding="utf-8").splitlines():
      try:
        records.append(json.loads(line))
      except ValueError:
        continue
  return records


def previous_wall_time(workdir: str | os.PathLike) -> float:
  """Wall time already spent by earlier runs in this workdir (seconds)."""
  wall = 0.0
  for record in read_metrics(workdir):
    if isinstance(record, dict):
      wall = float(record.get("wall_s", wall))
  return wall
