"""One launch per workdir: a second is refused naming the first; a dead one's lock is not."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from gcsfs.retry import HttpError

from configs import tiny
import conftest
from conftest import cpu_env, train_command
from flax_transformer import launch_lock, storage
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.errors import ConfigError, WorkdirBusyError
from flax_transformer.loop import train_and_evaluate
from flax_transformer.workdir import METRICS_FILE, Workdir


@pytest.fixture(params=["local", "gcs_bucket"])
def workdir(request, tmp_path):
  if request.param == "local":
    return Workdir(tmp_path)
  # Not node.name: fsspec reads its [param] as a glob pattern.
  return Workdir(f"{request.getfixturevalue('gcs_bucket')}/{request.node.originalname}")


def write_lock(workdir, **fields):
  record = {"host": "elsewhere", "pid": 4242, "started": "2026-11-27T10:00:00+00:00",
            "command": "train.py --workdir=x", "id": "theirs", "heartbeat": time.time(),
            **fields}
  workdir.lock_file.write_text(json.dumps(record))


def test_a_held_workdir_is_refused_naming_the_holder(workdir):
  held = launch_lock.LaunchLock(workdir, "train.py first").take()
  try:
    with pytest.raises(WorkdirBusyError) as refused:
      launch_lock.LaunchLock(workdir, "train.py second").take()
    message = str(refused.value)
    assert f"host {socket.gethostname()}, pid {held.record['pid']}" in message
    assert "command: train.py first" in message and launch_lock.RULE in message
    assert "\n" not in message
  finally:
    held.release()
  assert not workdir.lock_file.exists()
  launch_lock.LaunchLock(workdir, "train.py third").take().release()  # Free again.


def test_a_fresh_lock_from_another_host_is_respected(workdir):
  write_lock(workdir, heartbeat=time.time() - launch_lock.STALE_AFTER_S / 2)
  with pytest.raises(WorkdirBusyError, match=r"host elsewhere, pid 4242.*train.py --workdir=x"):
    launch_lock.LaunchLock(workdir, "train.py").take()
  assert json.loads(workdir.lock_file.read_text())["id"] == "theirs"  # Left as it was.


def test_a_lock_without_heartbeat_is_taken_over_with_a_warning(workdir, caplog):
  """Its holder stopped refreshing it (killed, or its host lost): stale after
  STALE_AFTER_S, whatever host it names."""
  write_lock(workdir, heartbeat=time.time() - launch_lock.STALE_AFTER_S - 5)
  with caplog.at_level(logging.WARNING):
    lock = launch_lock.LaunchLock(workdir, "train.py resume").take()
  assert "Taking over the lock" in caplog.text and "heartbeat is" in caplog.text
  assert json.loads(workdir.lock_file.read_text())["id"] == lock.record["id"]
  lock.release()


def test_a_lock_of_another_pid_namespace_on_this_host_is_judged_by_its_heartbeat(tmp_path):
  """A container sharing the host's name (docker --uts=host) runs in pids of its own: a
  pid that is gone here, or this very pid, says nothing of its launch."""
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  for pid in (dead.pid, os.getpid()):
    write_lock(Workdir(tmp_path), host=socket.gethostname(), pid=pid,
               pid_namespace="pid:[4026531836]-elsewhere")
    with pytest.raises(WorkdirBusyError, match="host .*, pid .*"):
      launch_lock.LaunchLock(tmp_path, "train.py").take()


def test_an_unreadable_lock_is_judged_by_its_age(tmp_path, caplog):
  """An empty lock (a host lost before its disk had the write, a kill mid-create): while
  young it may be a launch creating it, so refused; once older than STALE_AFTER_S it is
  taken over, not left blocking every resume."""
  lock_file = Workdir(tmp_path).lock_file
  lock_file.write_text("")
  with pytest.raises(WorkdirBusyError, match="unreadable"):
    launch_lock.LaunchLock(tmp_path, "train.py").take()
  old = time.time() - launch_lock.STALE_AFTER_S - 5
  os.utime(lock_file, (old, old))
  with caplog.at_level(logging.WARNING):
    lock = launch_lock.LaunchLock(tmp_path, "train.py resume").take()
  assert "Taking over the lock" in caplog.text and "heartbeat is" in caplog.text
  assert json.loads(lock_file.read_text())["id"] == lock.record["id"]
  lock.release()


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over_at_once(workdir, caplog):
  """kill -9: its heartbeat is fresh, but its pid is gone, so a resume is not held up."""
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  write_lock(workdir, host=socket.gethostname(), pid=dead.pid)
  with caplog.at_level(logging.WARNING):
    launch_lock.LaunchLock(workdir, "train.py resume").take().release()
  assert f"its pid {dead.pid} on this host is gone" in caplog.text


def test_two_launches_taking_over_one_stale_lock_do_not_both_win(workdir, monkeypatch):
  """A scheduler's restart racing a manual one: both read the stale lock, then one is a
  bucket round trip (0.5 s) slower to remove it. It must not remove the faster one's
  fresh lock: exactly one launch holds the workdir."""
  write_lock(workdir, heartbeat=time.time() - launch_lock.STALE_AFTER_S - 5)
  both_read, calls, real_read = threading.Barrier(2, timeout=30), threading.local(), launch_lock.read

  def read_then_pause(path):  # The store's read: both see the stale lock, one returns late.
    record = real_read(path)
    if threading.current_thread().name in ("faster", "slower") and not getattr(calls, "done",
                                                                            False):
      calls.done = True
      both_read.wait()
      if threading.current_thread().name == "slower":
        time.sleep(0.5)
    return record

  monkeypatch.setattr(launch_lock, "read", read_then_pause)
  outcomes = {}

  def launch():
    name = threading.current_thread().name
    try:
      outcomes[name] = launch_lock.LaunchLock(workdir, f"train.py {name}").take()
    except WorkdirBusyError as e:
      outcomes[name] = e

  threads = [threading.Thread(target=launch, name=name) for name in ("faster", "slower")]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  held = [lock for lock in outcomes.values() if isinstance(lock, launch_lock.LaunchLock)]
  try:
    assert len(held) == 1, outcomes
    assert json.loads(workdir.lock_file.read_text())["id"] == held[0].record["id"]
  finally:
    for lock in held:
      lock.release()


@pytest.mark.parametrize("fields, why", [
    ({"pid": os.getpid()}, "names this very process"),
    ({"pid": os.getppid(), "pid_start": -1}, "another process now"),
    ({"pid": os.getppid(), "boot_id": "an-earlier-boot"}, "rebooted since"),
])
def test_a_lock_of_a_restarted_container_or_reused_pid_is_stale(tmp_path, caplog, fields, why):
  """A pod's restart has the same host name and is pid 1 again: the lock names a live
  pid, this very process or another one, that is not its holder."""
  write_lock(Workdir(tmp_path), host=socket.gethostname(), **fields)
  with caplog.at_level(logging.WARNING):
    launch_lock.LaunchLock(tmp_path, "train.py resume").take().release()
  assert why in caplog.text


def test_a_live_holder_on_this_host_is_not_stale():
  parent = os.getppid()
  holder = {"host": socket.gethostname(), "boot_id": launch_lock._boot_id(), "pid": parent,
            "pid_start": launch_lock._start_time(parent), "heartbeat": time.time()}
  assert launch_lock.stale(holder) is None


def test_a_heartbeat_error_that_is_not_an_oserror_does_not_stop_the_heartbeat(
    tmp_path, monkeypatch, caplog):
  """gcsfs raises HttpError (not an OSError) for a bucket's 503: the next beat retries."""
  monkeypatch.setattr(launch_lock, "HEARTBEAT_S", 0.05)
  failures, real_write = [HttpError({"code": 503, "message": "Backend Error"})], storage.write_atomically

  def write_atomically(path, data):
    if failures:
      raise failures.pop()
    real_write(path, data)

  monkeypatch.setattr(storage, "write_atomically", write_atomically)
  with caplog.at_level(logging.WARNING):
    assert_heartbeats(tmp_path, "the heartbeat died")
  assert not failures and "Backend Error" in caplog.text


def test_a_heartbeat_finding_another_launch_marks_the_lock_lost(workdir, monkeypatch):
  """It stops rewriting the lock (which would overwrite the new holder's) and `check`
  stops the loop with one line naming the new holder."""
  monkeypatch.setattr(launch_lock, "HEARTBEAT_S", 0.05)
  lock = launch_lock.LaunchLock(workdir, "train.py").take()
  try:
    # Rewritten until seen, as the new holder's own heartbeat would: a heartbeat of ours
    # that read the lock just before a write may write over that one.
    deadline = time.time() + 30
    write_lock(workdir)
    while not lock.lost.wait(0.05):
      assert time.time() < deadline, "the heartbeat never saw the new holder"
      write_lock(workdir)
    with pytest.raises(WorkdirBusyError) as stopped:
      lock.check(7)
    message = str(stopped.value)
    assert "taken over by another launch (host elsewhere, pid 4242" in message
    assert "stopped at step 7" in message and "\n" not in message
    time.sleep(0.2)  # Heartbeats that would have overwritten it.
    assert json.loads(workdir.lock_file.read_text())["id"] == "theirs"
  finally:
    lock.release()
  assert json.loads(workdir.lock_file.read_text())["id"] == "theirs"  # Not removed.


def test_a_bucket_client_without_exclusive_writes_is_a_config_error(gcs_bucket, monkeypatch):
  """fsspec before 2024.12.0 refuses mode "xb" (its words below): one line naming the
  package to upgrade, not a traceback in setup_run."""
  from etils.epath import backend

  fs = backend.fsspec_backend.fs(gcs_bucket)

  def open_before_2024_12(path, mode="rb", **kwargs):
    raise NotImplementedError("File mode not supported")

  monkeypatch.setattr(fs, "open", open_before_2024_12)
  with pytest.raises(ConfigError, match=r"gcsfs cannot create a file exclusively .* upgrade it "
                     r"to 2024\.12\.0"):
    storage.create_exclusively(f"{gcs_bucket}/old_client/launch.lock", "{}")


def test_a_launch_whose_lock_is_taken_over_stops_at_the_next_step(tmp_path, multi30k_dir,
                                                                  monkeypatch):
  """The training loop checks the lock's `lost` at every step: it stops with
  WorkdirBusyError (train.py: one line, exit 2) before logging that step."""
  monkeypatch.setattr(launch_lock, "HEARTBEAT_S", 0.05)
  config = tiny.get_config()
  config.manual_dir = multi30k_dir
  config.compilation_cache_dir = conftest.XLA_CACHE  # Not the developer's ~/.cache.
  # Steps enough that a loaded machine (the take-over thread starved while the loop runs)
  # cannot finish the run before the lock changes hands: the loop stops well before.
  config.num_train_steps, config.log_every_steps = 20_000, 1
  config.bleu_every_steps = config.test_bleu_every_steps = 0
  config.eval_every_steps = config.checkpoint_every_steps = 1_000_000
  metrics = tmp_path / METRICS_FILE

  stopped_training = threading.Event()

  def take_over():
    deadline = time.time() + 300
    while not (metrics.exists() and metrics.read_text()) and time.time() < deadline:
      time.sleep(0.05)
    # The new holder keeps its lock fresh, as its own heartbeat would: a heartbeat of
    # ours that read its lock just before this write may still write over it once.
    while not stopped_training.is_set():
      write_lock(Workdir(tmp_path))
      stopped_training.wait(0.05)

  taker = threading.Thread(target=take_over, daemon=True)
  taker.start()
  try:
    with pytest.raises(WorkdirBusyError) as stopped:
      train_and_evaluate(config, str(tmp_path))
  finally:
    stopped_training.set()
    taker.join()
  message = str(stopped.value)
  assert "taken over by another launch (host elsewhere, pid 4242" in message
  assert "\n" not in message
  step = int(message.split("stopped at step ")[1].split()[0])
  assert [json.loads(line)["step"] for line in metrics.open()][-1] == step - 1
  assert json.loads(Workdir(tmp_path).lock_file.read_text())["id"] == "theirs"


def assert_heartbeats(workdir, message: str) -> None:
  """Takes `workdir`'s lock and waits (10 s at most) until its heartbeat rewrites it."""
  lock = launch_lock.LaunchLock(workdir, "train.py").take()
  try:
    first = json.loads(Workdir(workdir).lock_file.read_text())["heartbeat"]
    deadline = time.time() + 10
    while json.loads(Workdir(workdir).lock_file.read_text())["heartbeat"] == first:
      assert time.time() < deadline, message
      time.sleep(0.05)
  finally:
    lock.release()


def test_the_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
  monkeypatch.setattr(launch_lock, "HEARTBEAT_S", 0.05)
  assert_heartbeats(tmp_path, "no heartbeat")


def test_train_twice_on_one_workdir(tmp_path, multi30k_dir):
  """A relaunch while the first launch runs exits 2 with one line naming the first's
  host and pid, writing nothing; the first goes on unharmed (stopped by SIGTERM here: it
  saves, exits 0, every step logged once) and removes its lock."""
  command = train_command(tmp_path, multi30k_dir, "--config.num_train_steps=1000000",
                          "--config.log_every_steps=1")
  first = subprocess.Popen(command, env=cpu_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while not (tmp_path / "metrics.jsonl").exists():  # Training has begun.
      assert first.poll() is None and time.time() < deadline, "the first launch did not start"
      time.sleep(0.2)
    second = subprocess.run(command, env=cpu_env(), capture_output=True, text=True,
                            timeout=90)
    assert second.returncode == 2, second.stderr[-3000:]
    error = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"host {socket.gethostname()}, pid {first.pid}," in error[0]
    assert "its heartbeat is older than" in error[0]

    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=300)
  finally:
    if first.poll() is None:
      first.kill()
      first.wait()
  assert first.returncode == 0 and "Stopped by SIGTERM" in stderr, stderr[-3000:]
  logged = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
  assert logged == list(range(1, len(logged) + 1))
  assert Checkpointer(tmp_path, read_only=True).steps()[-1] == logged[-1]
  assert len(json.loads((tmp_path / "run.json").read_text())["launches"]) == 1
  assert not Workdir(tmp_path).lock_file.exists()
