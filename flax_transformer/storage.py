"""Local directories and object-storage buckets (gs://, s3://) behind one path type.

A location with a scheme becomes an `etils.epath.Path` (fsspec underneath: gcsfs
for gs://, s3fs for s3://, each an extra of this package); any other is a local
`pathlib.Path`. Both offer the same calls (`/`, open, read/write, exists, mkdir,
iterdir). What object storage lacks (appending, renaming in one step) the callers
work around through `is_remote`. Orbax reaches buckets itself, through tensorstore.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from flax_transformer.errors import ConfigError

# scheme -> (the fsspec client it needs, the extra that installs it)
CLIENTS = {"gs": ("gcsfs", "gcs"), "s3": ("s3fs", "s3")}


def as_path(location: str | os.PathLike) -> Any:
  """A pathlib.Path for a local location; an epath.Path for gs://... or s3://...."""
  if not isinstance(location, (str, os.PathLike)):
    return location  # Already an epath.Path.
  text = os.fspath(location)
  scheme = text.split("://", 1)[0] if "://" in text else ""
  if not scheme:
    return Path(text)
  if scheme not in CLIENTS:
    raise ConfigError(f"{text}: unsupported storage scheme {scheme}:// (local paths, gs:// and "
                      "s3:// are)")
  client, extra = CLIENTS[scheme]
  if importlib.util.find_spec(client) is None:
    raise ConfigError(f"{text}: {scheme}:// paths need {client}; install it with "
                      f"pip install 'flax-transformer[{extra}]'")
  from etils import epath

  return epath.Path(text)


def is_remote(path) -> bool:
  return "://" in os.fspath(path) if isinstance(path, (str, os.PathLike)) else True


def write_whole(path, data: str | bytes) -> None:
  """Writes `path` whole or not at all: local files through a rename (a reader or a
  crash never sees half of it); objects in a bucket are replaced whole by the store."""
  path = as_path(path)
  mode = "w" if isinstance(data, str) else "wb"
  if is_remote(path):
    with path.open(mode) as f:
      f.write(data)
    return
  partial = path.with_name(path.name + ".partial")
  try:
    with open(partial, mode) as f:
      f.write(data)
    os.replace(partial, path)
  finally:
    partial.unlink(missing_ok=True)


def local_dir_for(destination, prefix: str) -> str:
  """Where a tool that writes only local files (tensorboardX, jax's profiler) should
  write for `destination`: that directory itself, or for a bucket a fresh temporary
  one, which `upload_tree` copies there."""
  if is_remote(destination):
    return tempfile.mkdtemp(prefix=prefix)
  return os.fspath(destination)


def upload_tree(local: str, destination) -> None:
  """Copies every file under `local` to the same relative path under `destination`
  (whole files: objects are replaced, never appended to); nothing when `local` is
  `destination` itself."""
  if local == os.fspath(destination):
    return
  destination = as_path(destination)
  for f in Path(local).rglob("*"):
    if f.is_file():
      copy_file(f, destination / str(f.relative_to(local)))


def copy_file(source, destination) -> None:
  """One file, between any two locations (local or bucket)."""
  source, destination = as_path(source), as_path(destination)
  if not is_remote(source) and not is_remote(destination):
    shutil.copy2(source, destination)
    return
  destination.write_bytes(source.read_bytes())
