"""Where training metrics go: TensorBoard and JSON lines (process 0 only).

Both only ever add files or append: a local workdir's `metrics.jsonl` and event file
grow; in a bucket, where objects cannot be appended to, each flush writes new objects
holding only what was logged since the last (`JsonlWriter`, `TensorBoardWriter`).

clu's metric writers would be the natural choice, but `clu.metric_writers`
imports TensorFlow when imported; this project has no TensorFlow dependency,
so TensorBoard files are written through tensorboardX behind the same
`write_scalars(step, scalars)` interface.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from flax_transformer import storage
from flax_transformer.workdir import Workdir


def _plain(value: Any):
  value = np.asarray(value).item() if np.ndim(value) == 0 else np.asarray(value).tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)  # JSON has no NaN/inf; keep the fact, as a string.
  return value


def launch_stamp() -> str:
  """Names this launch's metric objects so that they sort by start time (UTC, to the
  microsecond; the random tail keeps two launches of one instant apart)."""
  now = datetime.datetime.now(datetime.timezone.utc)
  return f"{now:%Y%m%dT%H%M%S.%fZ}-{uuid.uuid4().hex[:4]}"


def _ends_in_newline(path) -> bool:
  with open(path, "rb") as f:
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b"\n"


class JsonlWriter:
  """One JSON object per `write_scalars` call: {"step": s, **scalars}.

  Local workdir: appended to `metrics.jsonl`, so a resumed run continues it. Bucket (an
  object cannot be appended to): each flush writes the lines since the last one as a
  new object `metrics/<launch stamp>-<flush number>.jsonl`, names that sort in write
  order. A flush then costs its own lines, not the run's, and two launches on one
  workdir never replace each other's lines; `read_metrics` reads both layouts.
  """

  def __init__(self, workdir: str | os.PathLike | Workdir, stamp: str | None = None):
    workdir = Workdir(workdir)
    self.remote = storage.is_remote(workdir.root)
    if self.remote:
      self.directory, self.stamp = workdir.metrics_dir, stamp or launch_stamp()
      self._lines, self._flushes = [], 0
    else:
      self.path = workdir.metrics_file
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._file = open(self.path, "a", encoding="utf-8")
      if self._file.tell() and not _ends_in_newline(self.path):
        # A crash cut the last line: appended onto it, this launch's first record
        # would merge with it and `read_metrics` would drop both.
        self._file.write("\n")

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    line = json.dumps({"step": int(step), **{k: _plain(v) for k, v in scalars.items()}}) + "\n"
    if self.remote:
      self._lines.append(line)
    else:
      self._file.write(line)

  def flush(self) -> None:
    if not self.remote:
      self._file.flush()
      return
    if self._lines:
      self._flushes += 1
      storage.write_atomically(self.directory / f"{self.stamp}-{self._flushes:06d}.jsonl",
                          "".join(self._lines))
      self._lines = []

  def close(self) -> None:
    if self.remote:
      self.flush()
    else:
      self._file.close()


class TensorBoardWriter:
  """TensorBoard event files through tensorboardX (no TensorFlow needed).

  For a logdir in a bucket the events go to a local directory first (tensorboardX's
  own bucket writers need TensorFlow's or boto's file layers, and fail without them),
  and each flush closes its event file, uploads it and starts the next: every upload
  is a new object holding only the events since the last (TensorBoard reads all the
  event files of a directory, in name order). Locally one file per launch grows.
  """

  def __init__(self, logdir: str | os.PathLike, stamp: str | None = None):
    self.logdir = storage.as_path(logdir)
    self.remote = storage.is_remote(self.logdir)
    self._local = storage.local_staging_dir(self.logdir, prefix="tensorboard-")
    self.stamp, self._files = stamp or launch_stamp(), 0
    self._writer = None

  def _current(self):
    if self._writer is None:
      from tensorboardX import SummaryWriter

      # Event files are named by the second and host: the launch and file number keep
      # one flush, or a quick relaunch, from replacing another's upload.
      self._files += 1
      self._writer = SummaryWriter(self._local, filename_suffix=(
          f".{self.stamp}-{self._files:06d}" if self.remote else ""))
    return self._writer

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for key, value in scalars.items():
      self._current().add_scalar(key, float(np.asarray(value)), global_step=int(step))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._current().add_text("hparams", json.dumps(dict(hparams), default=str, indent=1))

  def flush(self) -> None:
    if self._writer is None:
      return
    if not self.remote:
      self._writer.flush()
      return
    self._writer.close()
    self._writer = None
    for f in Path(self._local).iterdir():  # Only the file just closed: the others are gone.
      storage.copy_file(f, self.logdir / f.name)
      f.unlink()

  def close(self) -> None:
    if self.remote:
      self.flush()
      shutil.rmtree(self._local, ignore_errors=True)
    elif self._writer is not None:
      self._writer.close()


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
  """Process 0 writes TensorBoard and the metrics lines; other processes write nothing."""
  if process_index != 0:
    return MultiWriter([])
  workdir, stamp = Workdir(workdir), launch_stamp()
  return MultiWriter([JsonlWriter(workdir, stamp), TensorBoardWriter(workdir.tensorboard, stamp)])


def metrics_files(workdir: str | os.PathLike) -> list:
  """The files holding `workdir`'s metric lines, in write order: `metrics.jsonl` (a local
  workdir's, or a bucket's from before the per-flush objects), then `metrics/*.jsonl`
  by name (launch start time, then flush number)."""
  workdir = Workdir(workdir)
  storage.drop_cached_listings(workdir.root)  # Objects another launch wrote since.
  files = [workdir.metrics_file] if workdir.metrics_file.exists() else []
  if workdir.metrics_dir.exists():
    files += sorted(workdir.metrics_dir.glob("*.jsonl"), key=lambda p: p.name)
  return files


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """The logged steps of every run in `workdir` so far, oldest first (each launch's
  lines together, launches by start time); a line cut by a crash is skipped (the rest
  of the file still counts)."""
  files = metrics_files(workdir)
  # A bucket holds an object per flush: fetched side by side, not one round trip each.
  with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
    texts = list(pool.map(lambda p: p.read_text(encoding="utf-8"), files))
  records = []
  for text in texts:
    for line in text.splitlines():
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
