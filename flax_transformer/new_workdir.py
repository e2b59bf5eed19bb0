"""A new workdir written whole or not at all, by one writer (import_model.py's).

Locally it is filled in a hidden sibling folder, then renamed into place in one step
(rename(2) replaces an absent or empty directory, never one with files): a crash leaves
the workdir as it was, and of two writers racing for one workdir the second rename fails,
its folder is removed and it ends with one line; the first's workdir is whole. A bucket
cannot rename: the writer first takes the workdir's launch lock (`launch_lock`: an
exclusive create, so a second writer or a training launch is refused), checks that the
workdir holds nothing else, fills it with run.json written last, then releases the lock;
one that fails midway removes what it wrote.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import sys
from typing import Callable

from flax_transformer import storage
from flax_transformer.errors import ConfigError
from flax_transformer.workdir import LOCK_FILE, Workdir

TAKEN = ("--workdir={}: another writer created it while this one ran (its files are "
         "kept, none of this one's were written there): use a new --workdir")


def create(workdir: str | os.PathLike | Workdir, fill: Callable[[Workdir], None]) -> None:
  """Makes `workdir` (absent or an empty directory) hold exactly what `fill(w)` writes
  into the Workdir `w` it is given; ConfigError, `workdir` as found, when it is a file,
  not empty, or taken by another writer meanwhile."""
  workdir = Workdir(workdir)
  check_new(workdir)
  if storage.is_remote(workdir.root):
    _create_in_bucket(workdir, fill)
  else:
    _create_locally(workdir, fill)


def check_new(workdir: Workdir, ignore: tuple[str, ...] = ()) -> None:
  """ConfigError unless `workdir` is absent or an empty directory (but for `ignore`)."""
  root = workdir.root
  if root.exists() and not root.is_dir():
    raise ConfigError(f"--workdir={workdir} is a file, not a directory: give a new "
                      "directory's path")
  if root.is_dir() and any(p.name not in ignore for p in root.iterdir()):
    raise ConfigError(f"--workdir={workdir} exists and is not empty: use a new one")


def _create_locally(workdir: Workdir, fill: Callable[[Workdir], None]) -> None:
  root = workdir.root
  staging = root.with_name(f".{root.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
  try:
    root.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir()
  except OSError as e:
    raise ConfigError(f"--workdir={workdir}: cannot create a directory beside it "
                      f"({e.strerror or e})") from None
  try:
    fill(Workdir(staging))
    try:
      os.rename(staging, root)
    except OSError as e:
      if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        raise ConfigError(TAKEN.format(workdir)) from None
      raise ConfigError(f"--workdir={workdir}: moving the written workdir into place "
                        f"failed ({e.strerror or e})") from None
  finally:
    if staging.exists():
      shutil.rmtree(staging, ignore_errors=True)


def _create_in_bucket(workdir: Workdir, fill: Callable[[Workdir], None]) -> None:
  from flax_transformer import launch_lock

  lock = launch_lock.LaunchLock(workdir, " ".join(map(str, sys.argv))).take()
  try:
    storage.drop_cached_listings(workdir.root)  # Objects another writer wrote meanwhile.
    check_new(workdir, ignore=(LOCK_FILE,))
    try:
      fill(workdir)
    except BaseException:
      for entry in workdir.root.iterdir():
        if entry.name != LOCK_FILE:
          storage.remove(entry)
      raise
  finally:
    lock.release()
