"""Shared fixtures: the real Multi30k files and a vocabulary trained on them once; the
train.py command the tests launch and one uninterrupted reference run; buckets on
localhost; the session's compilation cache and device count."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Beside the checkout, or where MULTI30K_DIR says (bench/mutants.py runs a copy elsewhere).
MULTI30K = Path(os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k")


@pytest.fixture(scope="session")
def multi30k_dir() -> str:
  if not (MULTI30K / "train.en.gz").is_file():
    message = (f"Multi30k not found at {MULTI30K}: put the data beside the checkout "
               "(../shared/data/multi30k) to run the tests that read it")
    if os.environ.get("CI"):  # CI has the data beside it: a missing copy is a failure.
      pytest.fail(message)
    pytest.skip(message)
  return str(MULTI30K)


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_dir, tmp_path_factory):
  from flax_transformer.data import pipeline as data
  from flax_transformer.data import sources
  from flax_transformer.data import tokenizer

  pairs = sources.multi30k("train", "en", "de", manual_dir=multi30k_dir)
  path = tmp_path_factory.mktemp("vocab") / "vocab.model"
  return tokenizer.train_tokenizer(data.vocabulary_sentences(pairs, 100_000), path,
                                   vocab_size=4000)


def train_command(workdir, multi30k_dir, *overrides) -> list[str]:
  """train.py on the tiny config: no BLEU, no evaluation, a checkpoint every 10 steps;
  later overrides win."""
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/tiny.py"),
          f"--workdir={workdir}", f"--config.manual_dir={multi30k_dir}",
          "--config.bleu_every_steps=0", "--config.eval_every_steps=1000",
          "--config.checkpoint_every_steps=10", *overrides]


def translation_info(builder):
  """`_info` of a test's tfds translation builder (DE-EN pairs), as wmt14_translate's."""
  import tensorflow_datasets as tfds

  return tfds.core.DatasetInfo(
      builder=builder, features=tfds.features.Translation(languages=("de", "en")))


def cpu_env() -> dict:
  """The environment of a plain single-host run: one CPU device."""
  return dict(os.environ, XLA_FLAGS="")


def final_params(workdir):
  """(step, parameters) of the newest checkpoint in `workdir`, raw as saved."""
  import orbax.checkpoint as ocp

  from flax_transformer.checkpoints import Checkpointer

  checkpointer = Checkpointer(workdir, read_only=True)
  step = checkpointer.steps()[-1]
  restored = checkpointer.manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))
  return step, restored["state"]["params"]


def wait_for_checkpoint(workdir, minimum_step, process, timeout=120) -> None:
  """Returns once `process` has completed a checkpoint of `minimum_step` or later in
  `workdir` (a directory or a bucket), as a reader (orbax, through Checkpointer) sees it."""
  from flax_transformer import storage
  from flax_transformer.checkpoints import Checkpointer
  from flax_transformer.workdir import Workdir

  checkpoints = Workdir(workdir).checkpoints
  deadline = time.time() + timeout
  while time.time() < deadline:
    storage.forget_listings(checkpoints)  # A bucket's new objects, not a stale listing.
    steps = Checkpointer(workdir, read_only=True).steps() if checkpoints.exists() else []
    if steps and steps[-1] >= minimum_step:
      return
    assert process.poll() is None, process.stderr.read()
    time.sleep(0.2)
  raise TimeoutError(f"no checkpoint of step {minimum_step} or later in {checkpoints}")


def kill_resume_and_compare(workdir, multi30k_dir, uninterrupted) -> None:
  """train.py for RUN_STEPS in `workdir` (a directory or a bucket), `kill -9` once a
  checkpoint of step 20 is complete, the same command again: it must resume and end
  with the uninterrupted run's parameters, bit for bit."""
  import jax
  import numpy as np

  command = train_command(workdir, multi30k_dir, f"--config.num_train_steps={RUN_STEPS}")
  process = subprocess.Popen(command, env=cpu_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  wait_for_checkpoint(workdir, 20, process)
  process.send_signal(signal.SIGKILL)
  process.wait()
  resumed = subprocess.run(command, env=cpu_env(), capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from the checkpoint of step" in resumed.stderr
  step, params = final_params(workdir)
  _, expected_step, expected = uninterrupted
  assert step == expected_step == RUN_STEPS
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# Long enough that a test sees a checkpoint of step 20 and kills the run before its end.
RUN_STEPS = 200


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory, multi30k_dir):
  """A RUN_STEPS-step tiny run start to end: (its workdir, final step, final parameters), what
  interrupted and resumed runs must reach bit for bit."""
  workdir = tmp_path_factory.mktemp("straight")
  subprocess.run(train_command(workdir, multi30k_dir, f"--config.num_train_steps={RUN_STEPS}"),
                 env=cpu_env(), check=True, capture_output=True)
  return (workdir, *final_params(workdir))


# --- Buckets on localhost: a GCS emulator, an S3-compatible server ---------------------

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start_server(command: list[str], port: int) -> subprocess.Popen:
  server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 30
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      return server
    except OSError:
      assert time.time() < deadline and server.poll() is None, f"{command[1:3]} did not start"
      time.sleep(0.2)


# Session-wide: gcsfs and s3fs keep their clients (and the endpoints they were made
# with) for the life of the process, so each server must outlive every test using it.
@pytest.fixture(scope="session")
def gcs_bucket():
  """gs://test-bucket on an emulator (gcp-storage-emulator, with GCS's generation
  preconditions: tests/gcs_emulator.py); gcsfs finds it through STORAGE_EMULATOR_HOST,
  TensorStore through TENSORSTORE_GCS_HTTP_URL."""
  port = free_port()
  server = start_server([sys.executable, str(ROOT / "tests/gcs_emulator.py"), str(port)], port)
  monkeypatch = pytest.MonkeyPatch()
  for key, value in {
      "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",  # gcsfs
      "TENSORSTORE_GCS_HTTP_URL": f"http://127.0.0.1:{port}",  # TensorStore (orbax)
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # TensorStore asks for no credentials.
      # gcsfs asks GCS's control plane (gRPC, which the emulator lacks) for the bucket's
      # layout, retrying for a minute before it falls back to the plain JSON API.
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}.items():
    monkeypatch.setenv(key, value)
  yield "gs://test-bucket"
  monkeypatch.undo()
  server.kill()
  server.wait()


@pytest.fixture(scope="session")
def s3_bucket():
  """s3://test-bucket on moto's server; s3fs (botocore) and TensorStore (through
  storage.s3_kvstore) find it through AWS_ENDPOINT_URL."""
  port = free_port()
  server = start_server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                         str(port)], port)
  monkeypatch = pytest.MonkeyPatch()
  for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                     "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                     "AWS_DEFAULT_REGION": "us-east-1"}.items():
    monkeypatch.setenv(key, value)
  from flax_transformer import storage

  storage.as_path("s3://test-bucket").mkdir()  # Creates the bucket.
  yield "s3://test-bucket"
  monkeypatch.undo()
  server.kill()
  server.wait()


def pytest_configure(config):
  # Every sharding feature is tested on 8 simulated CPU devices; set before jax starts.
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # One compilation cache for the session, new each run: tests that build the same
  # step in another Trainer load it instead of compiling it again (a run that trains
  # in-process moves jax to its workdir's cache, as train.py does).
  from flax_transformer import compilation

  config.xla_cache = tempfile.mkdtemp(prefix="flax_transformer_test_xla_")
  compilation.enable_cache(config.xla_cache)
  config.addinivalue_line("markers", "devices(n): needs n devices (the CPU's 8 simulated ones)")
  if os.environ["JAX_PLATFORMS"] != "cpu":
    # On a GPU (JAX_PLATFORMS=cuda), float32 matmuls default to TF32 (10-bit
    # mantissas), about 1e-3 relative error: the tests' float32 tolerances hold
    # only at full float32 precision, so the suite runs with it. bfloat16 tests
    # have their own tolerances.
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")


def pytest_unconfigure(config):
  if getattr(config, "xla_cache", None):
    shutil.rmtree(config.xla_cache, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  import jax

  count = jax.device_count()
  for item in items:
    marker = item.get_closest_marker("devices")
    if marker and count < marker.args[0]:
      item.add_marker(pytest.mark.skip(
          reason=f"needs {marker.args[0]} devices, {count} {jax.devices()[0].platform} "
          "device(s) here: runs on the CPU's 8 simulated devices (the default)"))
