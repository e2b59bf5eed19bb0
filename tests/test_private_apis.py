"""The private parts of jax, orbax and etils the code reaches into are there, with the
attributes it uses: a version bump that removes one fails here, not in a user's run.

- jax: `jax._src.distributed.global_state.client` (training/distributed.py: the
  coordination service's barrier and live-node list; jax has no public API for them), and
  `jax._src.config.threefry_gpu_kernel_lowering` (compilation.threefry_kernel: a switch
  for one thread's compiles; `jax.config.update` would switch every thread's).
- orbax: `tensorstore_utils.build_kvstore_tspec` (storage.tensorstore_reaches_s3 wraps it to reach
  S3) and the gs:// spec layout the wrapper rewrites; `asyncio_utils.run_sync`, which
  checkpoints.finish_every_write wraps so that a failed save's other writes end first.
- CPython: `threading._shutdown` and `atexit._run_exitfuncs`, which
  cli.exit_without_teardown runs before os._exit (what Python's own exit runs first).
- etils: `epath.Path._backend`, which storage.as_path checks, and
  `backend.fsspec_backend.fs`, whose listings storage.drop_cached_listings drops.
"""

import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, cpu_env, free_port


def test_jax_distributed_client_has_the_calls_training_makes():
  """A one-process jax.distributed run in a subprocess (initialize is once per
  process): the client distributed._client() returns answers both calls."""
  script = textwrap.dedent(f"""
      import jax
      from flax_transformer.training import distributed
      jax.distributed.initialize("127.0.0.1:{free_port()}", num_processes=1, process_id=0)
      client = distributed._client()
      client.wait_at_barrier("private_api_test", 10_000)
      # A list in older jax, {{node: incarnation}} in newer: the code takes its set.
      print("live", sorted(set(client.get_live_nodes([0]))))
      jax.distributed.shutdown()
      """)
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=cpu_env(),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "live [0]" in result.stdout


def test_orbax_builds_the_gcs_specs_the_s3_wrapper_rewrites():
  from orbax.checkpoint._src.serialization import tensorstore_utils

  ocdbt = tensorstore_utils.build_kvstore_tspec("gs://bucket/run/checkpoints/5/state")
  assert ocdbt["driver"] == "ocdbt"
  assert ocdbt["base"] == {"driver": "gcs", "bucket": "bucket", "path": "run/checkpoints/5/state"}
  plain = tensorstore_utils.build_kvstore_tspec("gs://bucket/run", "x", use_ocdbt=False)
  assert plain == {"driver": "gcs", "bucket": "bucket", "path": "run/x"}


def test_orbax_runs_saves_through_the_run_sync_checkpoints_wraps():
  import asyncio

  from orbax.checkpoint._src import asyncio_utils

  import flax_transformer.checkpoints  # noqa: F401  Wraps it.

  assert asyncio_utils.run_sync.finishes_every_write
  ended = []

  async def write(seconds):
    await asyncio.sleep(seconds)
    ended.append(seconds)

  async def save():  # As orbax's array writes: one fails, its gather raises at once.
    async def fail():
      raise OSError("disk full")
    await asyncio.gather(fail(), write(0.2))

  with pytest.raises(OSError, match="disk full"):
    asyncio_utils.run_sync(save())
  assert ended == [0.2]  # The other write ended before run_sync raised.


def test_train_py_exits_with_pythons_exit_work_done():
  """exit_without_teardown in a child: a non-daemon thread is joined, an executor's idle
  worker ends, atexit handlers run, buffered output is written, exit status 0."""
  script = textwrap.dedent("""
      import atexit, concurrent.futures, sys, threading, time
      from flax_transformer.cli import common
      threading.Thread(target=lambda: (time.sleep(0.5), print("joined"))).start()
      concurrent.futures.ThreadPoolExecutor(1).submit(lambda: None).result()
      atexit.register(lambda: print("atexit ran"))
      sys.stdout.write("buffered ")
      common.exit_without_teardown()
      print("not reached")
      """)
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=cpu_env(),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout == "buffered joined\natexit ran\n"


def test_etils_backend_attributes_storage_uses(gcs_bucket):
  from etils.epath import backend

  from flax_transformer import storage

  path = storage.as_path(f"{gcs_bucket}/private-api")
  assert path._backend is backend.fsspec_backend  # noqa: SLF001
  assert callable(backend.fsspec_backend.fs(str(path)).invalidate_cache)
  storage.drop_cached_listings(path)


def test_threefry_kernel_switch_is_per_thread_and_in_the_compile_key():
  """compilation.threefry_kernel switches the parameter initialisation's compile alone:
  the train step compiling on another thread at the same time must keep XLA's lowering."""
  import threading

  import jax

  from flax_transformer import compilation

  assert hasattr(jax._src.config, "threefry_gpu_kernel_lowering")  # noqa: SLF001
  traces = []

  @jax.jit
  def bits(key):
    traces.append(jax.config.jax_threefry_gpu_kernel_lowering)
    return jax.random.bits(key, (3,))

  key = jax.random.key(0)
  bits(key)
  with compilation.threefry_kernel():
    bits(key)  # Traced anew: a program cached without the switch is not reused.
  bits(key)
  assert traces == [False, True]
  seen = {}
  inside, checked = threading.Event(), threading.Event()

  def other_thread():
    inside.wait(10)
    seen["other"] = jax.config.jax_threefry_gpu_kernel_lowering
    checked.set()

  thread = threading.Thread(target=other_thread)
  thread.start()
  with compilation.threefry_kernel():
    seen["inside"] = jax.config.jax_threefry_gpu_kernel_lowering
    inside.set()
    checked.wait(10)
  thread.join()
  assert seen == {"inside": True, "other": False}
  assert not jax.config.jax_threefry_gpu_kernel_lowering
