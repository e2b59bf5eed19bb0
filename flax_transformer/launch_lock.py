"""One launch per workdir: a lock that names the running launch, kept fresh by a heartbeat.

`<workdir>/launch.lock` (JSON: host, pid, launch time, command, heartbeat) is created
by process 0 of a launch before it writes anything else, rewritten every HEARTBEAT_S
with the time of its heartbeat, and removed when the launch ends. A second launch on
the workdir (a relaunch while the first still runs, locally or in a bucket) is refused
with one line naming the first. The rule for a lock left by a launch that died
(`kill -9`, a lost host), which must not block a resume:

  a lock is stale once its heartbeat is older than STALE_AFTER_S, or at once when its
  holder ran on this host and its pid is gone;

a stale lock is taken over with a warning. Heartbeats are compared across hosts' clocks,
which STALE_AFTER_S (four heartbeats) leaves room for.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid

import jax

from flax_transformer import storage
from flax_transformer.errors import WorkdirBusyError
from flax_transformer.training import distributed
from flax_transformer.workdir import Workdir

HEARTBEAT_S = 15.0
STALE_AFTER_S = 60.0

RULE = (f"a lock is stale once its heartbeat is older than {STALE_AFTER_S:.0f} s, or at once "
        "when its holder ran on this host and its pid is gone")


class LaunchLock:
  """The lock this launch holds on `workdir`: `take` it, then `release` it."""

  def __init__(self, workdir, command: str):
    self.path = Workdir(workdir).lock_file
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   "command": command, "id": uuid.uuid4().hex, "heartbeat": time.time()}
    self._stop = threading.Event()
    self._thread = None

  def take(self) -> LaunchLock:
    """Creates the lock, or takes over a stale one; WorkdirBusyError if it is held."""
    if not storage.create_exclusively(self.path, self._text()):
      holder = read(self.path)
      why = stale(holder) if holder is not None else "it vanished as it was read"
      if why is None:
        raise WorkdirBusyError(busy_message(self.path, holder))
      if holder is not None:
        logging.warning("Taking over the lock %s of an earlier launch (%s): %s", self.path,
                        describe(holder), why)
      self.path.unlink(missing_ok=True)
      if not storage.create_exclusively(self.path, self._text()):
        # Another launch took it over between the read and here: it is the holder now.
        raise WorkdirBusyError(busy_message(self.path, read(self.path)))
    self._thread = threading.Thread(target=self._beat, name="launch_lock", daemon=True)
    self._thread.start()
    return self

  def release(self) -> None:
    """Stops the heartbeat and removes the lock, if it still names this launch."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    holder = read(self.path)
    if holder is not None and holder.get("id") == self.record["id"]:
      self.path.unlink(missing_ok=True)

  def _text(self) -> str:
    return json.dumps(self.record, indent=1)

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      self.record["heartbeat"] = time.time()
      try:
        storage.write_whole(self.path, self._text())
      except OSError as e:  # A bucket's hiccup: the next heartbeat tries again.
        logging.warning("Refreshing the launch lock %s failed (%s)", self.path, e)


def read(path) -> dict | None:
  """The lock's record; None when there is none (or it is not a record: a write cut
  short, which counts as absent)."""
  storage.forget_listings(path)
  try:
    record = json.loads(storage.as_path(path).read_text())
  except (FileNotFoundError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def stale(holder: dict, now: float | None = None) -> str | None:
  """Why the lock `holder` no longer holds (RULE), or None while it does."""
  age = (time.time() if now is None else now) - float(holder.get("heartbeat", 0))
  if age > STALE_AFTER_S:
    return f"its heartbeat is {age:.0f} s old (stale after {STALE_AFTER_S:.0f} s)"
  if holder.get("host") == socket.gethostname() and not _alive(int(holder.get("pid", 0))):
    return f"its pid {holder.get('pid')} on this host is gone"
  return None


def _alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's process: alive.
    return True
  return True


def describe(holder: dict) -> str:
  return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
          f"{holder.get('started')}, command: {holder.get('command')}")


def busy_message(path, holder: dict | None) -> str:
  workdir = storage.as_path(path).parent
  if holder is None:
    return f"workdir {workdir} is in use by another launch ({path}); {RULE}"
  age = time.time() - float(holder.get("heartbeat", 0))
  return (f"workdir {workdir} is in use by a running launch ({describe(holder)}; heartbeat "
          f"{max(age, 0):.0f} s ago): stop it first, or use another --workdir. It is not "
          f"refused when that launch has died: {RULE} ({path})")


@contextlib.contextmanager
def hold(workdir, launch: dict | None = None):
  """Holds `workdir`'s lock for the launch (process 0 takes it; every process learns
  the outcome, so all stop alike when it is held elsewhere)."""
  argv = (launch or {}).get("argv") or sys.argv
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = LaunchLock(workdir, " ".join(map(str, argv))).take()
    except Exception as e:  # noqa: BLE001 -- raised below, once every process knows.
      error = e
  if not distributed.agreed(error is None):
    raise error or WorkdirBusyError(
        f"process 0 could not take the lock of workdir {workdir} (its log says why): stopping")
  try:
    yield lock
  finally:
    if lock is not None:
      lock.release()
