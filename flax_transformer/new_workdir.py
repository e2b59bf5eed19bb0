"""A new workdir written whole or not at all, by one writer (import_model.py's).

Locally it is filled in a hidden sibling folder, then renamed into place in one step
(rename(2) replaces an absent or empty directory, never one with files): a crash leaves
the workdir as it was (SIGTERM removes the hidden folder on its way out; one a SIGKILL
left is removed by the next write beside it on that host), and of two writers racing for one workdir the second rename fails,
its folder is removed and it ends with one line; the first's workdir is whole. A bucket
cannot rename: the writer first claims the workdir by creating CLAIM_FILE in it
exclusively (`storage.create_exclusively`: a second writer's create fails), checks that
the workdir holds nothing else, fills it with run.json written last, then removes the
claim; one that fails midway removes what it wrote. A claim left by a writer that died
leaves the workdir refused as not empty, as its partial files would.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Callable

from flax_transformer import storage
from flax_transformer.errors import ConfigError
from flax_transformer.workdir import Workdir

CLAIM_FILE = "import.claim"  # In a bucket, while a writer fills the workdir.

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
  if not storage.is_remote(root) and root.is_symlink():
    try:
      root.resolve()
    except (RuntimeError, OSError) as e:  # A loop of links.
      raise ConfigError(f"--workdir={workdir} is a symbolic link that leads nowhere "
                        f"({e}): give a new directory's path") from None
  if root.exists() and not root.is_dir():
    raise ConfigError(f"--workdir={workdir} is a file, not a directory: give a new "
                      "directory's path")
  if not storage.is_remote(root):
    above = next((p for p in root.parents if p.exists()), None)  # Where mkdir starts.
    if above is not None and not above.is_dir():
      raise ConfigError(f"--workdir={workdir} lies under {above}, a file, not a "
                        "directory: give a new directory's path")
  if root.is_dir() and any(p.name not in ignore for p in root.iterdir()):
    raise ConfigError(f"--workdir={workdir} exists and is not empty: use a new one")


def _create_locally(workdir: Workdir, fill: Callable[[Workdir], None]) -> None:
  root = workdir.root.resolve()  # A symlink's target is filled, not the link replaced.
  host = socket.gethostname().replace("/", "_")
  staging = root.with_name(f".{root.name}.{host}-{os.getpid()}-{secrets.token_hex(4)}.partial")
  try:
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_writers_staging(root, host)
    staging.mkdir()
  except OSError as e:
    raise ConfigError(f"--workdir={workdir}: cannot create a directory beside it "
                      f"({e.strerror or e})") from None
  try:
    with _sigterm_as_exit(workdir):
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


def _remove_dead_writers_staging(root: Path, host: str) -> None:
  """Removes the staging folders beside `root` that a writer on this host left when it
  was killed (SIGKILL, the machine's OOM killer): its process is gone, so no rename can
  come. A live writer's, or another host's, is left alone."""
  pattern = re.compile(rf"\.{re.escape(root.name)}\.{re.escape(host)}-(\d+)-[0-9a-f]{{8}}"
                       r"\.partial")
  for entry in root.parent.iterdir():
    match = pattern.fullmatch(entry.name)
    if match and entry.is_dir() and not _alive(int(match.group(1))):
      shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


@contextlib.contextmanager
def _sigterm_as_exit(workdir: Workdir):
  """While the workdir is written, SIGTERM (a scheduler's stop, `timeout`, `kill`) and
  SIGINT (Ctrl-C) end the process through the clean-up that removes the staging folder,
  with one line and exit 128 + the signal's number (Python's default SIGTERM ends the
  process on the spot; its Ctrl-C, a KeyboardInterrupt traceback)."""
  if threading.current_thread() is not threading.main_thread():
    yield  # Signal handlers belong to the main thread (a library caller's threads).
    return

  def stop(signum, frame):
    sys.stderr.write(f"\nerror: --workdir={workdir}: stopped by "
                     f"{signal.Signals(signum).name} while it was being written; nothing "
                     "was written there\n")
    raise SystemExit(128 + signum)

  previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)
              if sig == signal.SIGTERM or signal.getsignal(sig) is signal.default_int_handler}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _create_in_bucket(workdir: Workdir, fill: Callable[[Workdir], None]) -> None:
  claim = workdir.root / CLAIM_FILE
  if not storage.create_exclusively(claim, f"{socket.gethostname()} pid {os.getpid()}\n"):
    raise ConfigError(f"--workdir={workdir}: another import is writing it ({claim} exists; "
                      "if none runs, one that died left it): use a new --workdir")
  try:
    storage.drop_cached_listings(workdir.root)  # Objects another writer wrote meanwhile.
    check_new(workdir, ignore=(CLAIM_FILE,))
  except BaseException:
    storage.remove(claim)  # The files found are another writer's: kept.
    raise
  try:
    fill(workdir)
  except BaseException:
    for entry in workdir.root.iterdir():
      if entry.name != CLAIM_FILE:
        storage.remove(entry)
    raise
  finally:
    storage.remove(claim)
