"""Shared fixtures: the real Multi30k files and a vocabulary trained on them once; the
train.py command the tests launch and one uninterrupted reference run; buckets and an
HTTP server on localhost; the session's compilation cache and device count."""

import contextlib
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Beside the checkout, or where MULTI30K_DIR says (tools/mutants.py runs a copy elsewhere).
MULTI30K = Path(os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k")


def find_multi30k(local: Path, cache: Path, url: str = "", strict: bool = False) -> str:
  """The folder the tests read Multi30k from: `local` where it holds the files, else
  `cache` with every file fetched there once (from `url`, default the public repository),
  checked by SHA-256, as configs/multi30k.py does. Neither (or `strict`, a folder the
  user named, missing): the test fails, it does not skip."""
  from flax_transformer.data import sources

  if all((local / file).is_file() for file in sources.MULTI30K_SHA256):
    return str(local)
  if strict:
    pytest.fail(f"Multi30k not found at {local} (MULTI30K_DIR)", pytrace=False)
  try:
    for file in sources.MULTI30K_SHA256:
      sources.fetch_multi30k_file(file, cache, url or sources.MULTI30K_URL)
  except sources.DataError as e:
    pytest.fail(f"Multi30k: no copy at {local}, and fetching it into {cache} failed: {e}",
                pytrace=False)
  return str(cache)


@pytest.fixture(scope="session")
def multi30k_dir() -> str:
  from flax_transformer.data import sources

  return find_multi30k(MULTI30K, sources.multi30k_cache(),
                       strict=bool(os.environ.get("MULTI30K_DIR")))


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_dir, tmp_path_factory):
  from flax_transformer.data import pipeline as data
  from flax_transformer.data import sources
  from flax_transformer.data import tokenizer

  pairs = sources.multi30k("train", "en", "de", manual_dir=multi30k_dir)
  path = tmp_path_factory.mktemp("vocab") / "vocab.model"
  return tokenizer.train_tokenizer(data.vocabulary_sentences(pairs, 100_000), path,
                                   vocab_size=4000)


# The session's compilation cache (pytest_configure): the train.py and decode.py runs
# the tests launch use it too, so a fresh machine compiles each of their programs once,
# and a developer's own cache (~/.cache) neither hides those compiles nor collects them.
XLA_CACHE = ""


def train_command(workdir, multi30k_dir, *overrides) -> list[str]:
  """train.py on the tiny config: no BLEU, evaluation only at the last step (one batch
  shape: one compile), a checkpoint every 10 steps, the session's compilation cache;
  later overrides win."""
  return [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/tiny.py"),
          f"--workdir={workdir}", f"--config.manual_dir={multi30k_dir}",
          "--config.bleu_every_steps=0", "--config.eval_every_steps=1000",
          "--config.eval_max_shapes=1", "--config.checkpoint_every_steps=10",
          f"--config.compilation_cache_dir={XLA_CACHE}", *overrides]


def stderr_of_each(processes: dict, timeout: float) -> dict:
  """key -> stderr of each of `processes` (key -> Popen, stderr piped) once all exited;
  on a timeout, every one still running is killed before the error propagates."""
  try:
    return {key: p.communicate(timeout=timeout)[1] for key, p in processes.items()}
  finally:
    for p in processes.values():
      if p.poll() is None:
        p.kill()
        p.wait()


def translation_info(builder):
  """`_info` of a test's tfds translation builder (DE-EN pairs), as wmt14_translate's."""
  import tensorflow_datasets as tfds

  return tfds.core.DatasetInfo(
      builder=builder, features=tfds.features.Translation(languages=("de", "en")))


# On the CPU the suite compiles at XLA's backend level -O0, not its default -O2: compiling
# is most of its time. -O1 ran a cold tiny train.py launch in a third less CPU time than -O2
# (26 -> 17 s median, results/ci/2026-11-28_xla_opt_level.log); -O0 then ran the whole
# suite in 15% less CPU than -O1 (1459 -> 1243 user-s on fresh clones,
# results/ci/2026-11-28_fresh_clone_332_{df26918_n3_O1,9e2567b_n3_O0}.log) though its steps
# run slower. XLA's older elemental emitters then compile in a third less CPU than its
# fusion emitters, with the same losses and translations (the tiny train step and four
# beam searches in-process: 15.2 -> 10.1 CPU-s; results/ci/2026-11-29_fusion_emitters.log).
# The programs the tests compare are all compiled alike, in-process and launched (a value
# already in XLA_FLAGS is kept for both); FLAX_TRANSFORMER_TEST_XLA_OPT=2 runs the suite
# at XLA's defaults.
def suite_xla_flags() -> str:
  if os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":
    return ""  # An accelerator's suite runs as its users' programs.
  flags = os.environ.get("XLA_FLAGS", "")
  given = re.search(r"--xla_backend_optimization_level=(\d+)", flags)
  level = given[1] if given else os.environ.get("FLAX_TRANSFORMER_TEST_XLA_OPT", "0")
  given = re.search(r"--xla_cpu_use_fusion_emitters=(\w+)", flags)
  emitters = given[1] if given else ("true" if level == "2" else "false")
  return f"--xla_backend_optimization_level={level} --xla_cpu_use_fusion_emitters={emitters}"


def cpu_env(device_count: int = 1) -> dict:
  """The environment of a plain single-host run: one CPU device (or `device_count`
  simulated ones), with the suite's XLA compile flags."""
  flags = suite_xla_flags()
  if device_count > 1:
    flags += f" --xla_force_host_platform_device_count={device_count}"
  return dict(os.environ, XLA_FLAGS=flags.strip())


@contextlib.contextmanager
def http_server(respond):
  """A real HTTP server on localhost, in threads; `respond(handler)` answers each GET."""

  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
      respond(self)
      self.close_connection = True

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/{{file}}"
  finally:
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def compile_threads_busy():
  """Every thread of compilation's background executor held busy until the block ends,
  so that what the block queues there stays queued."""
  import threading

  from flax_transformer import compilation

  executor = compilation.background_executor()
  release, started = threading.Event(), threading.Semaphore(0)

  def hold():
    started.release()
    release.wait(60)

  blockers = [executor.submit(hold) for _ in range(executor._max_workers)]
  try:
    for _ in blockers:
      assert started.acquire(timeout=60)
    yield
  finally:
    release.set()
    for blocker in blockers:
      blocker.result(timeout=60)


def final_params(workdir):
  """(step, parameters) of the newest checkpoint in `workdir`, raw as saved."""
  import orbax.checkpoint as ocp

  from flax_transformer.checkpoints import Checkpointer

  checkpointer = Checkpointer(workdir, read_only=True)
  step = checkpointer.steps()[-1]
  restored = checkpointer.manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))
  return step, restored["state"]["params"]


def wait_for_checkpoint(workdir, minimum_step, process, timeout=120, hold=False) -> None:
  """Returns once `process` has completed a checkpoint of `minimum_step` or later in
  `workdir` (a directory or a bucket), as a reader (orbax, through Checkpointer) sees it.
  hold: in a local `workdir`, `process` is stopped (SIGSTOP) while each listing is read,
  and returned stopped: it runs only between listings (0.1 s), so a short run cannot
  reach its end unseen. Not in a bucket: a stopped client stalls the single-threaded GCS
  emulator (and our listing with it); there each save takes seconds, ample time to see
  a checkpoint before the run ends."""
  from flax_transformer import storage
  from flax_transformer.checkpoints import Checkpointer
  from flax_transformer.workdir import Workdir

  checkpoints = Workdir(workdir).checkpoints
  hold = hold and not storage.is_remote(checkpoints)
  deadline = time.time() + timeout
  while time.time() < deadline:
    if hold:
      process.send_signal(signal.SIGSTOP)
    storage.drop_cached_listings(checkpoints)  # A bucket's new objects, not a stale listing.
    steps = Checkpointer(workdir, read_only=True).steps() if checkpoints.exists() else []
    if steps and steps[-1] >= minimum_step:
      return
    assert process.poll() is None, process.stderr.read()
    if hold:
      process.send_signal(signal.SIGCONT)
    time.sleep(0.1 if hold else 0.2)
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
  try:
    wait_for_checkpoint(workdir, 20, process, hold=True)
  finally:  # Also when the wait fails: no run left behind, stopped or running.
    process.send_signal(signal.SIGKILL)
    process.wait()
  assert process.returncode == -signal.SIGKILL, "the run ended before it was killed"
  resumed = subprocess.run(command, env=cpu_env(), capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  # Resumed mid-run (a kill after the last save would leave nothing to train).
  resumed_at = re.search(r"Resumed from the checkpoint of step (\d+)", resumed.stderr)
  assert resumed_at and 20 <= int(resumed_at[1]) < RUN_STEPS, resumed.stderr[-3000:]
  step, params = final_params(workdir)
  _, expected_step, expected = uninterrupted
  assert step == expected_step == RUN_STEPS
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# Past the kill at step 20 by 4 more checkpoints: the resumed launch saves several
# times, as the killed one would have. (wait_for_checkpoint's `hold` makes sure the kill
# comes before the end, however fast the run.)
RUN_STEPS = 60


def once_per_run(tmp_path_factory, name: str, build) -> Path:
  """`build(folder)` once for the whole test run: with pytest-xdist, the first worker to
  ask builds it and the others wait for it and share it (never writing into it)."""
  import fcntl

  root = tmp_path_factory.getbasetemp()
  if re.fullmatch(r"popen-gw\d+", root.name):  # A pytest-xdist worker's own folder:
    root = root.parent  # the run's, above every worker's (never a folder of an older run).
  folder, done = root / name, root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)  # A failed build's leftovers.
      build(folder)
      done.touch()
  return folder


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory, multi30k_dir):
  """A RUN_STEPS-step tiny run start to end: (its workdir, final step, final parameters), what
  interrupted and resumed runs must reach bit for bit."""
  def build(workdir):
    subprocess.run(train_command(workdir, multi30k_dir, f"--config.num_train_steps={RUN_STEPS}"),
                   env=cpu_env(), check=True, capture_output=True)

  workdir = once_per_run(tmp_path_factory, "straight", build)
  return (workdir, *final_params(workdir))


# The checkpoints of `trained_tiny`: two, so averaging and ensembles have a choice.
TRAINED_TINY_CHECKPOINTS = (30, 60)


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory, multi30k_dir):
  """The workdir of one tiny run (60 steps: a model that tells sentences apart, with
  checkpoints at TRAINED_TINY_CHECKPOINTS), trained once for the session. Shared by the
  decode, export and averaging tests: they read it, and never write into it."""
  steps, every = TRAINED_TINY_CHECKPOINTS[-1], TRAINED_TINY_CHECKPOINTS[0]

  def build(folder):
    done = subprocess.run(train_command(folder / "run", multi30k_dir,
                                        f"--config.num_train_steps={steps}",
                                        f"--config.checkpoint_every_steps={every}"),
                          env=cpu_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

  return once_per_run(tmp_path_factory, "trained_tiny", build) / "run"


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


_SHARED_CACHE = "FLAX_TRANSFORMER_TEST_XLA_CACHE"


def pytest_configure(config):
  # Every sharding feature is tested on 8 simulated CPU devices; set before jax starts.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    flags += " --xla_force_host_platform_device_count=8"
  for flag in suite_xla_flags().split():  # Each the user's XLA_FLAGS does not set.
    if flag.split("=")[0] not in flags:
      flags += " " + flag
  os.environ["XLA_FLAGS"] = flags.strip()
  # One compilation cache for the session, new each run: tests that build the same
  # step in another Trainer load it instead of compiling it again (a run that trains
  # in-process moves jax to its workdir's cache, as train.py does).
  from flax_transformer import compilation

  global XLA_CACHE
  # A pytest-xdist worker (`workerinput`), not a pytest that a test starts (it inherits
  # the environment, PYTEST_XDIST_WORKER included).
  if hasattr(config, "workerinput") and os.environ.get(_SHARED_CACHE):
    XLA_CACHE = os.environ[_SHARED_CACHE]  # The run's, made by pytest-xdist's controller.
  else:
    config.xla_cache = XLA_CACHE = tempfile.mkdtemp(prefix="flax_transformer_test_xla_")
    os.environ[_SHARED_CACHE] = XLA_CACHE  # Its workers start after this, with it.
  compilation.enable_cache(XLA_CACHE)
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


# The files whose tests take longest (about 100 to 450 CPU seconds each on 2 cores), run
# first: pytest-xdist hands out whole files in this order, so the last to finish are short.
LONGEST_FIRST = ("test_training.py", "test_decoding.py", "test_doc_blocks.py",
                 "test_bench_accelerator.py",
                 "test_export.py", "test_reliability.py", "test_wmt.py", "test_recipe.py",
                 "test_model.py", "test_storage.py", "test_serve.py", "test_fine_tuning.py",
                 "test_scoring.py")


def pytest_collection_modifyitems(config, items):
  import jax

  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: file order kept.

  count = jax.device_count()
  for item in items:
    marker = item.get_closest_marker("devices")
    if marker and count < marker.args[0]:
      item.add_marker(pytest.mark.skip(
          reason=f"needs {marker.args[0]} devices, {count} {jax.devices()[0].platform} "
          "device(s) here: runs on the CPU's 8 simulated devices (the default)"))
