"""Faults lose at most the work since the last checkpoint; bad input gets a clear word."""

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conftest
from flax_transformer.checkpoints import CheckpointError, Checkpointer
from flax_transformer.averaging import average_params

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
    deadline = time.monotonic() + 60  # Closing threads end late on a loaded host.
    while not within(held(root), before) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert within(held(root), before), (caught.value, held(root), before)


def within(now: dict, before: dict) -> bool:
  """Nothing more is held than before (a thread of the warm-up may end meanwhile)."""
  return (now["threads"] <= before["threads"] and now["files"] == before["files"]
          and now["children"] <= before["children"])


def tiny_setup_config(multi30k_dir):
  from configs import tiny

  config = tiny.get_config()
  config.manual_dir, config.compile_ahead = multi30k_dir, False
  config.compilation_cache_dir = conftest.XLA_CACHE  # Not the developer's ~/.cache.
  config.data_workers = 0  # Worker processes need absl's parsed flags (train.py's).
  return config


def test_setup_run_failing_on_damaged_checkpoints_leaves_nothing_open(tmp_path, multi30k_dir):
  from flax_transformer.loop import setup_run
  from flax_transformer.workdir import Workdir

  checkpointer = Checkpointer(tmp_path, asynchronous=False)
  checkpointer.save(10, state_at(10), force=True)  # Not this model's state: cannot load.
  checkpointer.close()
  assert_releases(tmp_path, lambda: setup_run(tiny_setup_config(multi30k_dir),
                                              Workdir(tmp_path)),
                  CheckpointError, "none of the 1 checkpoints")


def test_setup_run_failing_after_opening_metrics_closes_them(tmp_path, multi30k_dir):
  from flax_transformer.loop import setup_run
  from flax_transformer.workdir import Workdir

  # metrics.jsonl opens; TensorBoard's folder cannot be made where a file is in the way.
  (tmp_path / "tensorboard").write_text("in the way")
  handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  assert_releases(tmp_path, lambda: setup_run(tiny_setup_config(multi30k_dir),
                                              Workdir(tmp_path)), OSError, "tensorboard")
  assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers


def test_closing_an_input_pipeline_blocked_in_its_parent_is_bounded(caplog):
  """grain's thread prefetch joins its producer with no timeout: blocked inside its
  parent's __next__ (here a map waiting on an event), close() would never return."""
  import grain

  from flax_transformer.data.pipeline import close_input

  gate, entered = threading.Event(), threading.Event()
  ds = grain.MapDataset.range(8).to_iter_dataset().map(
      lambda x: entered.set() or (gate.wait() and x))
  for blocked_close in (False, True):
    entered.clear()
    iterator = iter(grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=1))
    threading.Thread(target=lambda: next(iterator, None), daemon=True).start()
    assert entered.wait(60)  # The producer is in the map now, waiting.
    if not blocked_close:
      closing = threading.Thread(target=iterator.close, daemon=True)
      closing.start()
      closing.join(1.0)
      assert closing.is_alive()  # grain's own close: still joining.
      continue
    start = time.monotonic()
    close_input(iterator, timeout_s=1.0)
    assert time.monotonic() - start < 5
    assert "did not stop within 1 s" in caplog.text
  gate.set()  # The producers end; so do the closes.
  close_input(object())  # No close (grain before DatasetIterator.close): nothing to do.


TRAIN_ENV = conftest.cpu_env()


def train_command(workdir, multi30k_dir, *overrides) -> list[str]:
  """conftest's train.py command (the tiny config, the session's compilation cache),
  logging every 5 steps; later overrides win."""
  return conftest.train_command(workdir, multi30k_dir, "--config.log_every_steps=5",
                                *overrides)


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
  assert re.search(r"XLA_FLAGS: .*--xla_gpu_enable_triton_gemm=false", result.stderr)
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


# train.py runs that stop at their --config flag or just after it (their time is Python's
# and jax's start): `config_flag_runs` launches them all at once, the cores sharing them.
BEST = str(ROOT / "configs/multi30k_best.py")
CONFIG_FLAG_RUNS = {  # name -> train.py's flags, given the run's own folder.
    "unknown_pair": lambda d: [f"--config={BEST}:en-xx", f"--workdir={d}"],
    "missing_file": lambda d: [f"--config={d / 'my_config.py'}", f"--workdir={d / 'w'}"],
    "broken_file": lambda d: [f"--config={d / 'my_config.py'}", f"--workdir={d / 'w'}"],
    "pair_argument": lambda d: [f"--config={BEST}:en-fr", f"--workdir={d / 'w'}",
                                f"--config.manual_dir={d / 'absent'}"],
}


@pytest.fixture(scope="module")
def config_flag_runs(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
  """CONFIG_FLAG_RUNS, launched at once: name -> (its folder, exit code, stderr). The
  broken file's folder holds a my_config.py with a syntax error."""
  folders = {name: tmp_path_factory.mktemp(name) for name in CONFIG_FLAG_RUNS}
  (folders["broken_file"] / "my_config.py").write_text("def get_config(:\n")
  processes = {name: subprocess.Popen(
      [sys.executable, str(ROOT / "train.py"), *flags(folders[name])], env=TRAIN_ENV,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
      for name, flags in CONFIG_FLAG_RUNS.items()}
  stderrs = conftest.stderr_of_each(processes, timeout=120)
  return {name: (folders[name], p.returncode, stderrs[name]) for name, p in processes.items()}


def test_a_bad_config_argument_is_one_line_without_a_traceback(config_flag_runs):
  _, returncode, stderr = config_flag_runs["unknown_pair"]
  assert returncode == 2
  assert "Traceback" not in stderr
  assert "unknown pair 'en-xx': choose one of en-de, en-fr" in stderr.splitlines()[0]


@pytest.mark.parametrize("name,message", [
    ("missing_file", "does not exist"), ("broken_file", "line 1: invalid syntax")])
def test_a_missing_or_broken_config_file_is_named(config_flag_runs, name, message):
  folder, returncode, stderr = config_flag_runs[name]
  assert returncode == 2, stderr
  assert "Traceback" not in stderr
  assert str(folder / "my_config.py") in stderr and message in stderr


def test_a_config_argument_reaches_get_config(config_flag_runs):
  # "FILE:ARG" names FILE (the README's best-recipe commands): the run gets as far
  # as reading data, here a missing directory, instead of stopping at the flag.
  folder, returncode, stderr = config_flag_runs["pair_argument"]
  assert returncode == 2, stderr
  assert "does not exist" not in stderr
  assert f"{folder / 'absent'}/train.en.gz: no such file" in stderr


# --- Checkpoint averaging: its failure paths, its flag, its arithmetic -----------------

@pytest.fixture
def small_workdir(tmp_path, multi30k_tokenizer):
  """A workdir of three checkpoints of a 1-layer model: run.json, vocabulary, steps
  10, 20, 30 whose parameters are random ones (incompressible: 128 kB of embedding)
  times 1, 2, 3."""

  from flax_transformer import TransformerConfig
  from flax_transformer.averaging import abstract_params
  from flax_transformer.workdir import Workdir, record_run

  config = TransformerConfig(vocab_size=multi30k_tokenizer.vocab_size, d_model=8, d_ff=16,
                             num_heads=2, num_layers=1, max_len=32)
  record_run(tmp_path, config, config.vocab_size)
  shutil.copyfile(multi30k_tokenizer.path, Workdir(tmp_path).vocab_file)
  rng = np.random.default_rng(0)
  base = jax.tree_util.tree_map(lambda s: rng.normal(size=s.shape).astype(s.dtype),
                                abstract_params(config))
  checkpointer = Checkpointer(tmp_path, asynchronous=False)
  for step in (10, 20, 30):
    checkpointer.save(step, {"params": jax.tree_util.tree_map(lambda x: x * step / 10, base)},
                      force=True)
  checkpointer.close()
  return tmp_path, config


def test_load_params_of_a_missing_step_leaves_nothing_open(small_workdir):
  from flax_transformer.averaging import load_params

  workdir, config = small_workdir
  assert_releases(workdir, lambda: load_params(workdir, config, checkpoint_step=15),
                  CheckpointError, r"no checkpoint of step 15 .* steps: \[10, 20, 30\]", times=3)


def test_averaging_over_a_damaged_checkpoint_names_it(small_workdir):
  """decode.py, export.py and average_checkpoints.py reach this: one line naming the step
  (a CheckpointError, exit 2), not a traceback from orbax's JSON or TensorStore reader."""
  from flax_transformer.averaging import load_params

  workdir, config = small_workdir
  for f in data_files(workdir, 20):
    f.write_bytes(b"{")
  assert_releases(workdir, lambda: load_params(workdir, config, average_last=2),
                  CheckpointError, r"checkpoint .*/20 cannot be loaded .*--checkpoint_step",
                  times=1)
  params, steps = load_params(workdir, config, checkpoint_step=10)  # Another choice works.
  assert steps == [10]


def test_write_averaged_failing_leaves_nothing_open_and_the_output_as_found(small_workdir,
                                                                          tmp_path_factory):
  import resource

  from flax_transformer.averaging import write_averaged
  from flax_transformer.errors import CheckpointSaveError

  workdir, _ = small_workdir
  out = tmp_path_factory.mktemp("averaged")
  assert write_averaged(workdir, out / "ok", 2) == [20, 30]  # Warms up orbax's writer.
  (out / "full").mkdir()
  (out / "full" / "notes.txt").write_text("mine")
  assert_releases(out, lambda: write_averaged(workdir, out / "full", 2), CheckpointError,
                  "exists and is not empty")
  assert [p.name for p in (out / "full").iterdir()] == ["notes.txt"]

  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  (out / "empty").mkdir()
  # Files may not grow past the limit (EFBIG, as a full disk gives ENOSPC): 2 kB stops
  # the copy of the vocabulary (62 kB), 100 kB the save of the embedding (128 kB).
  for limit, failing in ((2_000, "writing .*/empty failed"),
                         (100_000, "writing checkpoint of step 30 to .*/empty/checkpoints failed")):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
      assert_releases(out, lambda: write_averaged(workdir, out / "empty", 2),
                      CheckpointSaveError, failing, times=3)
      assert_releases(out, lambda: write_averaged(workdir, out / "new", 2),
                      CheckpointSaveError, failing.replace("empty", "new"))
    finally:
      resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  assert not list((out / "empty").iterdir()) and not (out / "new").exists()
  # The save fails at the embedding while the other arrays' writes are held (as a loaded
  # machine holds them): they go on only after write_averaged raised, or after 2 s if it
  # waits for them; the output must be as found once they end.
  resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
  try:
    with writes_held(lambda value: value.nbytes < 100_000, release_after=2.0) as release:
      with pytest.raises(CheckpointSaveError, match="checkpoint of step 30"):
        try:
          write_averaged(workdir, out / "empty", 2)
        finally:
          release()
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  assert not list((out / "empty").rglob("*"))
  assert write_averaged(workdir, out / "empty", 2) == [20, 30]  # Nothing in its way.


@contextlib.contextmanager
def writes_held(hold, release_after: float):
  """orbax's array writes for which `hold(value)` is true start in threads of their own
  (as TensorStore's do) once the block calls the release it is given, or `release_after`
  seconds after the first; the block's end waits for them. Yields the release."""
  from orbax.checkpoint._src.serialization import serialization

  original = serialization.async_serialize_from_host
  release, threads = threading.Event(), []

  async def held_serialize(value, *args, **kwargs):
    if not hold(value):
      return await original(value, *args, **kwargs)
    done = concurrent.futures.Future()

    def write():
      release.wait(release_after)
      try:
        done.set_result(asyncio.run(original(value, *args, **kwargs)))
      except BaseException as e:  # noqa: BLE001  Handed to the awaiting task, if any.
        done.set_exception(e)

    threads.append(threading.Thread(target=write))
    threads[-1].start()
    return await asyncio.wrap_future(done)

  serialization.async_serialize_from_host = held_serialize
  try:
    yield release.set
  finally:
    serialization.async_serialize_from_host = original
    release.set()
    for thread in threads:
      thread.join(60)
    assert threads, "no write was held"


def test_average_last_below_one_is_named_by_every_entry_point(small_workdir, tmp_path_factory):
  from flax_transformer.averaging import load_params, write_averaged
  from flax_transformer.cli.export import run_export
  from flax_transformer.errors import ConfigError
  from flax_transformer.translation.search_config import SearchConfig
  from flax_transformer.translation.translator import Translator

  workdir, config = small_workdir
  out = tmp_path_factory.mktemp("average_last")
  message = r"^--average_last must be at least 1 .* got 0$"
  with pytest.raises(ConfigError, match=message):
    load_params(workdir, config, average_last=0)
  with pytest.raises(ConfigError, match=message):
    Translator.from_workdir(workdir, average_last=0)
  with pytest.raises(ConfigError, match=message.replace("got 0", "got -2")):
    run_export(workdir=str(workdir), out=str(out / "export"), fmt="stablehlo",
               search=SearchConfig(), batch_tokens=256, average_last=-2, checkpoint_step=None,
               platforms=["cpu"], quantization="float32", overwrite=False)
  with pytest.raises(ConfigError, match=r"^--last must be at least 1 .* got 0$"):
    write_averaged(workdir, out / "averaged", 0)
  assert not list(out.iterdir())  # Nothing written, not even a folder.
  sentences = out / "in.en"
  sentences.write_text("A dog runs.\n")
  done = subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}",
                         f"--input={sentences}", "--average_last=0"], env=TRAIN_ENV,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr
  assert "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1] == (
      "error: --average_last must be at least 1 (how many of the newest checkpoints to "
      "average; 1 = the newest alone), got 0")


def saved(steps_trees: dict) -> str:
  """A fresh folder holding a checkpoint {"params": tree} per (step, tree)."""
  import tempfile

  folder = tempfile.mkdtemp(prefix="averaging-")
  checkpointer = Checkpointer(folder, asynchronous=False)
  for step, tree in steps_trees.items():
    checkpointer.save(step, {"params": tree}, force=True)
  checkpointer.close()
  return folder


def assert_mean_then_cast(result, trees: list, dtypes) -> None:
  """`result` is numpy's float32 mean of `trees`, leaf by leaf, cast to `dtypes`' leaves:
  up to float32 rounding (the sum's order may differ), which in a narrower dtype may
  only move a value to the neighbour of the mean's own rounding."""
  mean = jax.tree_util.tree_map(
      lambda *xs: np.mean(np.stack([np.asarray(x, np.float32) for x in xs]), axis=0,
                          dtype=np.float32), *trees)
  for r, m, d in zip(*map(jax.tree_util.tree_leaves, (result, mean, dtypes))):
    assert np.asarray(r).dtype == d
    slack = 1e-6 * np.abs(m) + 1e-6
    low, high = ((m - slack).astype(d).astype(np.float32),
                 (m + slack).astype(d).astype(np.float32))  # Rounding is monotonic.
    r = np.asarray(r, np.float32)
    assert np.all((low <= r) & (r <= high)), (r, m)


DTYPES = st.sampled_from([np.dtype(np.float32), np.dtype(jnp.bfloat16)])
LEAF = st.tuples(DTYPES, st.lists(st.integers(1, 4), max_size=2).map(tuple))
PYTREE = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.recursive(
    LEAF, lambda inner: st.dictionaries(st.sampled_from(["x", "y"]), inner, min_size=1),
    max_leaves=4), min_size=1)


@settings(max_examples=8, deadline=None)
@given(layout=PYTREE, count=st.integers(1, 6), choices=st.data(), seed=st.integers(0, 2**16))
def test_average_params_is_numpys_float32_mean_then_cast(layout, count, choices, seed):
  rng = np.random.default_rng(seed)
  is_leaf = lambda x: isinstance(x, tuple) and isinstance(x[0], np.dtype)  # noqa: E731
  dtypes = jax.tree_util.tree_map(lambda leaf: leaf[0], layout, is_leaf=is_leaf)
  steps = sorted(int(s) for s in rng.choice(np.arange(1, 1000), count, replace=False))
  trees = {s: jax.tree_util.tree_map(
      # Around 100: partial sums reach several hundred, where bfloat16's steps are
      # coarse, so a sum kept in bfloat16 lands steps away from the float32 mean.
      lambda leaf: np.asarray(100 + 10 * rng.normal(size=leaf[1]), leaf[0]), layout,
      is_leaf=is_leaf)
      for s in steps}
  last = choices.draw(st.integers(1, count), label="average_last")
  target = jax.tree_util.tree_map(
      lambda leaf: jax.ShapeDtypeStruct(leaf[1], leaf[0], sharding=jax.sharding.
                                        SingleDeviceSharding(jax.devices()[0])),
      layout, is_leaf=is_leaf)
  folder = saved(trees)
  try:
    checkpointer = Checkpointer(folder, read_only=True)
    mean = average_params(checkpointer, steps[-last:], target)
    checkpointer.close()
  finally:
    shutil.rmtree(folder)
  assert_mean_then_cast(mean, [trees[s] for s in steps[-last:]], dtypes)


@settings(max_examples=5, deadline=None)
@given(count=st.integers(1, 4), choices=st.data(), seed=st.integers(0, 2**16))
def test_load_params_averages_the_last_k_up_to_the_step_asked_for(count, choices, seed):
  from flax_transformer import TransformerConfig
  from flax_transformer.averaging import abstract_params, load_params

  config = TransformerConfig(vocab_size=16, d_model=8, d_ff=16, num_heads=2, num_layers=1,
                             max_len=16)
  rng = np.random.default_rng(seed)
  target = abstract_params(config)
  # Saved in float32 or bfloat16 leaf by leaf; read back as the model's float32.
  saved_dtypes = jax.tree_util.tree_map(
      lambda _: choices.draw(DTYPES, label="saved dtype"), target)
  steps = sorted(int(s) for s in rng.choice(np.arange(1, 1000), count, replace=False))
  trees = {s: jax.tree_util.tree_map(lambda a, d: rng.normal(size=a.shape).astype(d), target,
                                     saved_dtypes) for s in steps}
  last = choices.draw(st.integers(1, count + 1), label="average_last")  # count + 1: fewer.
  upto = choices.draw(st.sampled_from([None, *steps]), label="checkpoint_step")
  chosen = [s for s in steps if upto is None or s <= upto][-last:]
  folder = saved(trees)
  try:
    params, used = load_params(folder, config, checkpoint_step=upto, average_last=last)
  finally:
    shutil.rmtree(folder)
  assert used == chosen
  assert_mean_then_cast(params, [trees[s] for s in chosen],
                        jax.tree_util.tree_map(lambda a: a.dtype, target))


@pytest.mark.parametrize("tool", ["decode.py", "tools/results.py"])
def test_default_averaging_is_quiet_on_one_checkpoint_an_asked_number_warns(tool, caplog):
  """An imported model's workdir holds one checkpoint: decode.py, serve.py and
  tools/results.py without --average_last (None: the last 5 or as many as there are) load
  it without warning "fewer than the 5 asked for" (tools/results.py defaulted to 5 until
  its flag took decode.py's); --average_last=5 given explicitly still warns."""
  from flax_transformer import TransformerConfig
  from flax_transformer.averaging import abstract_params, load_params
  from tools import results

  config = TransformerConfig(vocab_size=16, d_model=8, d_ff=16, num_heads=2, num_layers=1,
                             max_len=16)
  tree = jax.tree_util.tree_map(lambda a: np.ones(a.shape, a.dtype), abstract_params(config))
  folder = saved({0: tree})
  try:
    with caplog.at_level(logging.WARNING):
      default = (None if tool == "decode.py"  # flags.py's, as absl defines it once.
                 else results.flags().parse_args(["--workdir", folder]).average_last)
      _, used = load_params(folder, config, average_last=default)
      assert used == [0]
      assert not [r for r in caplog.records if "fewer than" in r.getMessage()]
      _, used = load_params(folder, config, average_last=5)
      assert used == [0]
    assert [r.getMessage() for r in caplog.records if "fewer than" in r.getMessage()] == [
        "Averaging 1 checkpoints ([0]): fewer than the 5 asked for"]
  finally:
    shutil.rmtree(folder)
