"""One launch per workdir: a lock that names the running launch, kept fresh by a heartbeat.

`<workdir>/launch.lock` (JSON: host, boot id, pid and its start time, launch time,
command, a launch id, heartbeat) is created by process 0 of a launch before it writes
anything else, rewritten every HEARTBEAT_S with the time of its heartbeat, and removed
when the launch ends. A second launch on the workdir (a relaunch while the first still
runs, locally or in a bucket) is refused with one line naming the first. The rule for a
lock left by a launch that died (`kill -9`, a lost host, a restarted container), which
must not block a resume:

  a lock is stale once its heartbeat is older than STALE_AFTER_S, or at once when its
  holder ran on this host and is gone: its pid is gone, names another process (started
  at another time, or this very process, which holds no such lock: a container's
  restart is pid 1 again), or the host has rebooted since;

a stale lock is taken over with a warning. Heartbeats are compared across hosts' clocks,
which STALE_AFTER_S (four heartbeats) leaves room for.

Two launches taking over one stale lock at once (a scheduler's restart racing a manual
one) must not both win. Locally the stale file is renamed aside and checked to be the
one judged stale before it is deleted (else put back, and the launch refused); in a
bucket, where objects cannot be renamed or deleted conditionally through every client,
the taker waits TAKEOVER_SETTLE_S and reads the lock back: the later writer wins, the
other is refused. Every take reads its lock back, which also catches a store that
ignores the conditional create. Last, each heartbeat reads the lock before rewriting
it: one naming another launch marks this one `lost`, and the training loop stops with
one line at its next step (`check`). A heartbeat that read its own lock just before a
taker wrote may write over the taker's lock once: the taker's own heartbeat then finds
this launch's lock and stops the taker, so one of the two always stops.
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
from pathlib import Path

import jax

from flax_transformer import collectives, storage
from flax_transformer.errors import WorkdirBusyError
from flax_transformer.workdir import Workdir

HEARTBEAT_S = 15.0
STALE_AFTER_S = 60.0
# Longer than a takeover's delete-and-create in a bucket (two round trips).
TAKEOVER_SETTLE_S = 2.0

RULE = (f"a lock is stale once its heartbeat is older than {STALE_AFTER_S:.0f} s, or at once "
        "when its holder ran on this host, in this process namespace, and is gone (its pid "
        "gone or reused, or the host rebooted)")

# Launch ids of the locks this process holds: a lock naming this pid with another id was
# left by an earlier process that had the same pid (a restarted container's pid 1).
_HELD: set[str] = set()


class LaunchLock:
  """The lock this launch holds on `workdir`: `take` it, then `release` it."""

  def __init__(self, workdir, command: str):
    self.path = Workdir(workdir).lock_file
    pid = os.getpid()
    self.record = {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid,
                   "pid_start": _start_time(pid), "pid_namespace": _pid_namespace(),
                   "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   "command": command, "id": uuid.uuid4().hex, "heartbeat": time.time()}
    self.lost = threading.Event()  # Set by the heartbeat once another launch holds the lock.
    self.holder = None  # That launch's record, once lost.
    self._stop = threading.Event()
    self._thread = None

  def take(self) -> LaunchLock:
    """Creates the lock, or takes over a stale one; WorkdirBusyError if it is held."""
    # Read first, not only the conditional create: a store that ignores it (s3fs says
    # MinIO or Ceph may) still refuses a relaunch while the first launch runs.
    holder = read(self.path)
    took_over = holder is not None
    if took_over:
      why = stale(holder)
      if why is None:
        raise WorkdirBusyError(busy_message(self.path, holder))
      logging.warning("Taking over the lock %s of an earlier launch (%s): %s", self.path,
                      describe(holder), why)
      self._remove_stale(holder)
    if not storage.create_exclusively(self.path, self._text()):
      # Another launch created it between the read and here: it is the holder now.
      raise WorkdirBusyError(busy_message(self.path, read(self.path)))
    if took_over and storage.is_remote(self.path):
      time.sleep(TAKEOVER_SETTLE_S)  # A racing taker deletes ours and writes its own by now.
    holder = read(self.path)
    if holder is None or holder.get("id") != self.record["id"]:
      raise WorkdirBusyError(busy_message(self.path, holder))
    _HELD.add(self.record["id"])
    self._thread = threading.Thread(target=self._beat, name="launch_lock", daemon=True)
    self._thread.start()
    return self

  def release(self) -> None:
    """Stops the heartbeat and removes the lock, if it still names this launch."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    _HELD.discard(self.record["id"])
    holder = read(self.path)
    if holder is not None and holder.get("id") == self.record["id"]:
      self.path.unlink(missing_ok=True)

  def check(self, step: int) -> None:
    """Raises WorkdirBusyError once the heartbeat found another launch holding the lock
    (cheap: an Event, for every step)."""
    if self.lost.is_set():
      raise WorkdirBusyError(
          f"workdir {storage.as_path(self.path).parent} was taken over by another launch "
          f"({describe(self.holder)}) while this one trained: stopped at step {step} without "
          f"writing its metrics or checkpoint, so that only one launch writes there ({self.path})")

  def _text(self) -> str:
    return json.dumps(self.record, indent=1)

  def _remove_stale(self, holder: dict) -> None:
    """Deletes the lock `holder` judged stale, and only that one (WorkdirBusyError if
    another launch has taken it over since it was read)."""
    if storage.is_remote(self.path):
      # No rename, no conditional delete: `take` reads back what it creates instead.
      self.path.unlink(missing_ok=True)
      return
    aside = self.path.with_name(f"{self.path.name}.{self.record['id']}")
    try:
      os.rename(self.path, aside)  # One step: of two takers, one moves the file.
    except FileNotFoundError:
      return  # Another taker moved it: the create decides between us.
    moved = read(aside)
    if moved is not None and moved.get("id") == holder.get("id"):
      aside.unlink()
      return
    # A fresh lock of a launch that took over first: put it back (unless a third
    # launch's lock is there by now: then that one holds) and refuse.
    try:
      storage.create_exclusively(self.path, aside.read_text())
    finally:
      aside.unlink(missing_ok=True)
    raise WorkdirBusyError(busy_message(self.path, moved))

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        holder = read(self.path)
        if holder is not None and holder.get("unreadable"):
          holder = self.record  # Ours, damaged on disk: rewritten below.
        if holder is not None and holder.get("id") != self.record["id"]:
          # Taken over (this launch's heartbeats stalled past STALE_AFTER_S): writing on
          # would overwrite the new holder's lock, and both would train.
          self.holder = holder
          self.lost.set()
          logging.error("The launch lock %s now names another launch (%s): stopping at the "
                        "next step", self.path, describe(holder))
          return
        self.record["heartbeat"] = time.time()
        if holder is None:  # Moved aside for a moment by a taker checking it: create it.
          storage.create_exclusively(self.path, self._text())
        else:
          storage.write_atomically(self.path, self._text())
      except Exception as e:  # noqa: BLE001 -- gcsfs' HttpError, auth refreshes: try again.
        logging.warning("Refreshing the launch lock %s failed (%s)", self.path, e)


def read(path) -> dict | None:
  """The lock's record; None when there is none. A lock that is not a record (empty or
  cut short: a crash mid-write, a host lost before its disk had it) gives one marked
  `unreadable` whose heartbeat is the file's modification time, so RULE's age test
  judges it: it never blocks a resume for good."""
  storage.drop_cached_listings(path)
  path = storage.as_path(path)
  try:
    record = json.loads(path.read_text())
  except FileNotFoundError:
    return None
  except ValueError:
    record = None
  if isinstance(record, dict):
    return record
  try:
    modified = path.stat().st_mtime if not storage.is_remote(path) else path.stat().mtime
  except (OSError, AttributeError):
    modified = 0.0  # Gone meanwhile, or a store that gives no time: stale.
  return {"unreadable": True, "heartbeat": modified, "host": "?", "pid": 0,
          "command": f"unknown (the lock {path} is unreadable)"}


def stale(holder: dict, now: float | None = None) -> str | None:
  """Why the lock `holder` no longer holds (RULE), or None while it does."""
  age = (time.time() if now is None else now) - float(holder.get("heartbeat", 0))
  if age > STALE_AFTER_S:
    return f"its heartbeat is {age:.0f} s old (stale after {STALE_AFTER_S:.0f} s)"
  if holder.get("host") != socket.gethostname():
    return None
  pid = int(holder.get("pid", 0))
  boot_id = _boot_id()
  if holder.get("boot_id") and boot_id and holder["boot_id"] != boot_id:
    return f"this host has rebooted since (boot id {holder['boot_id']}, now {boot_id})"
  namespace = _pid_namespace()
  if holder.get("pid_namespace") and namespace and holder["pid_namespace"] != namespace:
    # Another container sharing the host's name (docker --uts/--net=host): its pids are
    # not ours to look up; its heartbeat's age decides.
    return None
  if pid == os.getpid():
    if holder.get("id") in _HELD:
      return None
    return (f"it names this very process (pid {pid}), which holds no such lock: an earlier "
            "process with the same pid (a restarted container)")
  if not _alive(pid):
    return f"its pid {pid} on this host is gone"
  started = _start_time(pid)
  if None not in (holder.get("pid_start"), started) and started != holder["pid_start"]:
    return f"its pid {pid} on this host is another process now (started at another time)"
  return None


def _pid_namespace() -> str | None:
  """This process's pid namespace (Linux; None elsewhere): pids mean something only in
  their own."""
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return None


def _boot_id() -> str | None:
  """This boot of the host (Linux; None elsewhere): pids of another boot mean nothing."""
  try:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
  except OSError:
    return None


def _start_time(pid: int) -> int | None:
  """When process `pid` started, in clock ticks after boot (Linux; None elsewhere or
  when it is gone): tells a reused pid from its first process."""
  try:
    stat = Path(f"/proc/{pid}/stat").read_text()
  except OSError:
    return None
  # Field 22, counted after the command name: that is in parentheses and may hold spaces.
  return int(stat.rpartition(")")[2].split()[19])


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


def check(lock: LaunchLock | None, step: int, *, everywhere: bool = False) -> None:
  """`lock.check(step)` on process 0, which holds the lock (`lock` is None elsewhere).

  everywhere: a point every process reaches at the same step (before writing metrics or
  a checkpoint): process 0's verdict is agreed on, so every process stops there with
  one line instead of waiting in the next collective for a process 0 that left.
  """
  if not everywhere or jax.process_count() == 1:
    if lock is not None:
      lock.check(step)
    return
  if collectives.broadcast_from_process0(lock is not None and lock.lost.is_set()):
    if lock is not None:
      lock.check(step)
    raise WorkdirBusyError(f"process 0 found the workdir's lock taken over by another launch: "
                           f"stopped at step {step} without writing its metrics or checkpoint")


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
  if not collectives.broadcast_from_process0(error is None):
    raise error or WorkdirBusyError(
        f"process 0 could not take the lock of workdir {workdir} (its log says why): stopping")
  try:
    yield lock
  finally:
    if lock is not None:
      lock.release()
