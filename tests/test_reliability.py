"""Faults lose at most the work since the last checkpoint; bad input gets a clear word."""

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.checkpoints import CheckpointError, Checkpointer
from flax_transformer.checkpoints import average_params

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # configs/


def state_at(step):
  # Weights grow as step^2, so their mean (steps 10, 20, 30: 466.67) differs from the
  # median (400), the last (900) and the mean of the first and last (500).
  return {"params": {"w": jnp.full((4, 3), float(step) ** 2), "b": jnp.arange(3.0) + step},
          "step": jnp.array(step, jnp.int32)}


def abstract():
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=jax.sharding.SingleDeviceSharding(
                                         jax.devices()[0])), state_at(0))


@pytest.fixture
def three_checkpoints(tmp_path):
  checkpointer = Checkpointer(tmp_path, asynchronous=False)
  for step in (10, 20, 30):
    checkpointer.save(step, state_at(step), force=True)
  checkpointer.wait()
  checkpointer.close()
  return tmp_path


def data_files(workdir, step):
  return [p for p in (Path(workdir) / "checkpoints" / str(step) / "state").rglob("*")
          if p.is_file() and p.stat().st_size > 0 and "metadata" not in p.name]


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_newest_checkpoint_falls_back_with_a_warning(three_checkpoints, damage, caplog):
  files = data_files(three_checkpoints, 30)
  assert files
  for f in files:
    if damage == "truncate":
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    else:
      f.unlink()
  with caplog.at_level(logging.WARNING):
    step, state = Checkpointer(three_checkpoints).restore_latest(abstract())
  assert step == 20
  np.testing.assert_array_equal(state["params"]["w"], np.full((4, 3), 400.0))
  assert any("checkpoints/30 cannot be loaded" in r.getMessage() for r in caplog.records)
  # Set aside (not deleted), so training can write step 30 again.
  assert list((three_checkpoints / "checkpoints").glob("30.unusable-*"))
  checkpointer = Checkpointer(three_checkpoints, asynchronous=False)
  assert checkpointer.steps() == [10, 20]
  checkpointer.save(30, state_at(30), force=True)
  checkpointer.wait()
  assert checkpointer.restore_latest(abstract())[0] == 30


def test_no_loadable_checkpoint_is_an_error_not_a_fresh_start(three_checkpoints):
  for step in (10, 20, 30):
    for f in data_files(three_checkpoints, step):
      f.write_bytes(b"garbage")
  with pytest.raises(CheckpointError, match="none of the 3 checkpoints .* can be loaded"):
    Checkpointer(three_checkpoints).restore_latest(abstract())


def test_average_is_the_elementwise_mean(three_checkpoints):
  target = abstract()["params"]
  mean = average_params(Checkpointer(three_checkpoints, read_only=True), [10, 20, 30], target)
  np.testing.assert_allclose(mean["w"], np.full((4, 3), (100 + 400 + 900) / 3), rtol=1e-6)
  np.testing.assert_allclose(mean["b"], np.arange(3.0) + 20.0, rtol=1e-6)
  # The newest two only, in either order.
  mean = average_params(Checkpointer(three_checkpoints, read_only=True), [30, 20], target)
  np.testing.assert_allclose(mean["w"], np.full((4, 3), 650.0), rtol=1e-6)


def held(root) -> dict:
  """This process's threads (native ones too), its open files under `root` and its child
  processes."""
  files = []
  for fd in os.listdir("/proc/self/fd"):
    try:
      target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # The listing's own descriptor, closed by now.
      continue
    if target.startswith(str(root)):
      files.append(target)
  return {"threads": len(os.listdir("/proc/self/task")), "files": sorted(files),
          "children": len(multiprocessing.active_children())}


def assert_releases(root, fail, error, match, times=2):
  """`fail()` raises `error` and leaves nothing open under `root`, no thread and no
  process. The first call warms up what stays for the process's life (jax's backend,
  TensorStore's pools); each later one must end holding what it started with, once the
  threads that closing starts (orbax's) end."""
  with pytest.raises(error, match=match):
    fail()
  for _ in range(times - 1):
    before = held(root)
    assert not before["files"]
    # Held as a caller holds it while reporting: its frames keep their locals alive,
    # so what the code did not close is still open, not collected first.
    with pytest.raises(error, match=match) as caught:
      fail()
    deadline = time.monotonic() + 10
    while held(root) != before and time.monotonic() < deadline:
      time.sleep(0.05)
    assert held(root) == before, caught.value


def tiny_setup_config(multi30k_dir):
  from configs import tiny

  config = tiny.get_config()
  config.manual_dir, config.compile_ahead = multi30k_dir, False
  config.data_workers = 0  # Worker processes need absl's parsed flags (train.py's).
  return config


def test_setup_run_failing_on_damaged_checkpoints_leaves_nothing_open(tmp_path, multi30k_dir):
  from flax_transformer.loop import setup_run
  from flax_transformer.workdir import Workdir

  checkpointer = Checkpointer(tmp_path, asynchronous=False)
  checkpointer.save(10, state_at(10), force=True)  # Not this model's state: cannot load.
  checkpointer.close()
  assert_releases(tmp_path, lambda: setup_run(tiny_setup_config(multi30k_dir),
                                              Workdir(tmp_path)), CheckpointError, "none of the 1 checkpoints")


def test_setup_run_failing_after_opening_metrics_closes_them(tmp_path, multi30k_dir):
  from flax_transformer.loop import setup_run
  from flax_transformer.workdir import Workdir

  # metrics.jsonl opens; TensorBoard's folder cannot be made where a file is in the way.
  (tmp_path / "tensorboard").write_text("in the way")
  handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  assert_releases(tmp_path, lambda: setup_run(tiny_setup_config(multi30k_dir),
                                              Workdir(tmp_path)), OSError, "tensorboard")
  assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers


TRAIN_ENV = dict(os.environ, XLA_FLAGS="")


def train_command(workdir, multi30k_dir, *overrides) -> list[str]:
  """train.py on the tiny config, no BLEU; later overrides win."""
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/tiny.py"),
          f"--workdir={workdir}", f"--config.manual_dir={multi30k_dir}",
          "--config.bleu_every_steps=0", "--config.log_every_steps=5", *overrides]


def run_train(tmp_path, multi30k_dir, *overrides):
  return subprocess.run(train_command(tmp_path, multi30k_dir, *overrides), env=TRAIN_ENV,
                        capture_output=True, text=True)


def test_nonfinite_loss_stops_naming_the_step_and_saves_nothing_bad(tmp_path, multi30k_dir):
  result = run_train(tmp_path, multi30k_dir, "--config.learning_rate=1e30",
                     "--config.checkpoint_every_steps=100")
  assert result.returncode == 1, result.stderr
  assert "non-finite loss" in result.stderr and "at step" in result.stderr
  assert "Traceback" not in result.stderr
  assert not list((tmp_path / "checkpoints").glob("[0-9]*"))


def test_nonfinite_steps_can_be_skipped(tmp_path, multi30k_dir):
  result = run_train(tmp_path, multi30k_dir, "--config.learning_rate=1e30",
                     "--config.nan_policy=skip", "--config.num_train_steps=10",
                     "--config.checkpoint_every_steps=10")
  assert result.returncode == 0, result.stderr
  assert "update skipped" in result.stderr
  # The entry point's default XLA flags (compilation.DEFAULT_XLA_FLAGS), named in the log.
  assert "XLA_FLAGS: --xla_gpu_enable_triton_gemm=false" in result.stderr
  assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()] == ["10"]


def test_failed_save_is_a_clear_error_and_older_checkpoints_survive(tmp_path, multi30k_dir):
  import resource

  first = run_train(tmp_path, multi30k_dir, "--config.num_train_steps=10",
                    "--config.checkpoint_every_steps=10")
  assert first.returncode == 0, first.stderr
  # Files may not grow past 64 kB (EFBIG, as a full disk gives ENOSPC): the next save fails.
  limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))  # noqa: E731
  second = subprocess.run(
      train_command(tmp_path, multi30k_dir, "--config.num_train_steps=20",
                    "--config.checkpoint_every_steps=10"),
      env=TRAIN_ENV, capture_output=True, text=True, preexec_fn=limit)
  assert second.returncode == 1, second.stderr
  # orbax logs its own details (from its save thread, so sometimes after ours); the
  # run itself says what happened in one line.
  ours = [line for line in second.stderr.splitlines() if line.startswith("error:")]
  assert len(ours) == 1, second.stderr
  assert ours[0].startswith("error: writing a checkpoint") and "failed" in ours[0]
  assert "intact: steps [10]" in ours[0]
  steps = Checkpointer(tmp_path, read_only=True).steps()
  assert steps == [10]
  rerun = run_train(tmp_path, multi30k_dir, "--config.num_train_steps=20",
                    "--config.checkpoint_every_steps=10")
  assert rerun.returncode == 0, rerun.stderr
  assert Checkpointer(tmp_path, read_only=True).steps() == [10, 20]


def test_workdir_deleted_under_a_running_job_stops_it_clearly(tmp_path, multi30k_dir):
  import shutil
  import time

  workdir = tmp_path / "run"
  job = subprocess.Popen(
      train_command(workdir, multi30k_dir, "--config.num_train_steps=100000",
                    "--config.checkpoint_every_steps=10", "--config.log_every_steps=10"),
      env=TRAIN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 600
    while not (workdir / "checkpoints" / "10").is_dir():
      assert job.poll() is None and time.time() < deadline, "no checkpoint appeared"
      time.sleep(0.5)
    while workdir.exists():  # orbax may be writing into it as it goes.
      shutil.rmtree(workdir, ignore_errors=True)
    _, stderr = job.communicate(timeout=300)
  finally:
    job.kill()
  assert job.returncode == 2, stderr
  # orbax's save thread may also log the failure of the save it had under way.
  ours = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(ours) == 1, stderr
  assert "was deleted or replaced while training" in ours[0] and "run.json is gone" in ours[0]
  # Nothing was saved from the step that noticed on: only a save already under way
  # when the directory went may have landed (orbax re-creates its directories).
  stopped = int(ours[0].split("stopped at step ")[1].split()[0])
  if (workdir / "checkpoints").exists():
    assert all(int(p.name) < stopped
               for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_checkpoints_by_time_as_the_paper_saved_them(tmp_path, multi30k_dir):
  # Steps alone would save only at the end (step 20); any time > 6 ms saves at log steps.
  result = run_train(tmp_path, multi30k_dir, "--config.num_train_steps=20",
                     "--config.checkpoint_every_steps=1000", "--config.keep_checkpoints=10",
                     "--config.checkpoint_every_minutes=0.0001")
  assert result.returncode == 0, result.stderr
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved == [5, 10, 15, 20]


def test_a_bad_config_argument_is_one_line_without_a_traceback(tmp_path):
  result = subprocess.run([sys.executable, str(ROOT / "train.py"),
                           "--config=" + str(ROOT / "configs/multi30k_best.py") + ":en-xx",
                           f"--workdir={tmp_path}"], env=TRAIN_ENV, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert "unknown pair 'en-xx': choose one of en-de, en-fr" in result.stderr.splitlines()[0]


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"), ("def get_config(:\n", "line 1: invalid syntax")])
def test_a_missing_or_broken_config_file_is_named(tmp_path, content, message):
  config = tmp_path / "my_config.py"
  if content is not None:
    config.write_text(content)
  result = subprocess.run([sys.executable, str(ROOT / "train.py"), f"--config={config}",
                           f"--workdir={tmp_path / 'w'}"], env=TRAIN_ENV, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert "Traceback" not in result.stderr
  assert str(config) in result.stderr and message in result.stderr


def test_a_config_argument_reaches_get_config(tmp_path):
  # "FILE:ARG" names FILE (the README's best-recipe commands): the run gets as far
  # as reading data, here a missing directory, instead of stopping at the flag.
  result = subprocess.run([sys.executable, str(ROOT / "train.py"),
                           "--config=" + str(ROOT / "configs/multi30k_best.py") + ":en-fr",
                           f"--workdir={tmp_path / 'w'}",
                           f"--config.manual_dir={tmp_path / 'absent'}"],
                          env=TRAIN_ENV, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr
  assert "does not exist" not in result.stderr
  assert f"{tmp_path / 'absent'}/train.en.gz: no such file" in result.stderr
