"""One launch per workdir: a second is refused naming the first; a dead one's lock is not."""

import json
import logging
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import cpu_env, train_command
from flax_transformer import launch_lock
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.errors import WorkdirBusyError
from flax_transformer.workdir import Workdir


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


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over_at_once(workdir, caplog):
  """kill -9: its heartbeat is fresh, but its pid is gone, so a resume is not held up."""
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  write_lock(workdir, host=socket.gethostname(), pid=dead.pid)
  with caplog.at_level(logging.WARNING):
    launch_lock.LaunchLock(workdir, "train.py resume").take().release()
  assert f"its pid {dead.pid} on this host is gone" in caplog.text


def test_the_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
  monkeypatch.setattr(launch_lock, "HEARTBEAT_S", 0.05)
  lock = launch_lock.LaunchLock(tmp_path, "train.py").take()
  try:
    first = json.loads(Workdir(tmp_path).lock_file.read_text())["heartbeat"]
    deadline = time.time() + 10
    while json.loads(Workdir(tmp_path).lock_file.read_text())["heartbeat"] == first:
      assert time.time() < deadline, "no heartbeat"
      time.sleep(0.05)
  finally:
    lock.release()


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
