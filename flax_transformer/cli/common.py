"""What the entry points share: logging set-up, multi-process start, errors -> exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Callable

import jax
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from flax_transformer import compilation, errors, host
from flax_transformer.errors import EXIT_BAD_INPUT, EXIT_FAILED
from flax_transformer.training import host_allocator


@contextlib.contextmanager
def exit_on_errors():
  """Known problems become one line on stderr and an exit code, not a traceback."""
  try:
    yield
  except errors.BAD_INPUT as e:
    _report(e)
    sys.exit(EXIT_BAD_INPUT)
  except errors.RUN_FAILED as e:
    _report(e)
    sys.exit(EXIT_FAILED)


def _report(error: BaseException) -> None:
  # One write, starting on a fresh line: orbax's save threads may still be printing
  # their own tracebacks, and `print` writes the text and its newline separately, so
  # its line could be split or land behind a half-written one (seen in CI).
  sys.stderr.write(f"\nerror: {error}\n")
  sys.stderr.flush()


def parse_flags_or_exit(argv: list[str]) -> list[str]:
  """absl flag parsing where a bad flag or config override exits 2 with one clear line."""
  try:
    remaining = flags.FLAGS(argv)
    _check_config_file()
    return remaining
  except SyntaxError as e:  # Raised by the config file itself, not wrapped.
    print(f"error: config file {e.filename}, line {e.lineno}: {e.msg}", file=sys.stderr)
  except _MissingConfig as e:
    print(f"error: {e}", file=sys.stderr)
  except flags.Error as e:
    message = str(e)
    if "Traceback (most recent call last)" in message:
      # ml_collections embeds the config file's traceback: keep its heading and the
      # exception's own line (e.g. "ValueError: unknown pair 'en-xx': ...").
      lines = [line for line in message.splitlines() if line.strip()]
      message = f"{lines[0].rstrip(':')}: {lines[-1].strip()}"
    print(f"error: {message}\nRun with --helpfull to list the flags.", file=sys.stderr)
  except AttributeError as e:
    # ml_collections: an override such as --config.foo=1 names a key the config lacks.
    detail = e.args[0] if e.args else e
    detail = detail.args[0] if isinstance(detail, KeyError) and detail.args else detail
    overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    print(f"error: unknown config key {detail} (overrides: {', '.join(overrides)}); every key "
          "is documented in configs/default.py", file=sys.stderr)
  except (KeyError, TypeError, ValueError) as e:
    print(f"error: bad --config or override: {e}", file=sys.stderr)
  sys.exit(EXIT_BAD_INPUT)


class _MissingConfig(Exception):
  pass


def _check_config_file() -> None:
  """ml_collections defers a missing config file's error to the first read of the
  config, deep inside training: name the file now instead."""
  if "config" not in flags.FLAGS or not flags.FLAGS["config"].present:
    return
  # The flag keeps "FILE:ARG" whole; ml_collections passes what follows the first
  # colon to get_config, so only the part before it names the file.
  path = config_flags.get_config_filename(flags.FLAGS["config"]).split(":", 1)[0]
  if not os.path.isfile(path):
    raise _MissingConfig(f"config file {path} does not exist (--config=FILE[:ARG]; the "
                         "configs are in configs/)")


def setup_logging() -> None:
  absl_logging.set_verbosity(absl_logging.INFO)
  # Libraries' INFO chatter (orbax, tfds, absl) would drown the progress lines.
  for name in ("absl", "orbax", "jax", "tensorflow_datasets", "grain"):
    logging.getLogger(name).setLevel(logging.WARNING)


# How long a silent process counts as alive (jax.distributed's heartbeat timeout; jax's
# default is 100 s), and how often this process asks which peers are alive.
HEARTBEAT_TIMEOUT_S = 30
PEER_POLL_S = 2.0


def maybe_initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                                 process_id: int | None) -> None:
  """Joins a multi-process run (one process per host).

  With `coordinator_address`, as given. Without it, jax.distributed's own cluster
  detection (Cloud TPU VM slices, SLURM, Open MPI, Kubernetes JobSets) supplies
  the address, process count and index; where it finds no cluster the run is a
  single process.
  """
  if jax.config.jax_platforms in (None, "", "cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # A lost process is then reported to the others (`_exit_when_a_peer_is_lost`), not fatal to them.
  if hasattr(jax.config, "jax_enable_recoverability"):  # jax 0.7.1 lacks it.
    jax.config.update("jax_enable_recoverability", True)
  options = dict(num_processes=num_processes, process_id=process_id,
                 heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  if coordinator_address:
    jax.distributed.initialize(coordinator_address=coordinator_address, **options)
    return
  if jax.distributed.is_initialized():
    return
  try:
    jax.distributed.initialize(**options)
  except ValueError as e:
    # jax's words when no cluster was detected and nothing was given.
    if "coordinator_address should be defined" not in str(e):
      raise
    logging.info("No cluster detected (jax.distributed): running as a single process")
    return
  except RuntimeError as e:
    # Called in-process after JAX already started (a notebook, a test): too late to join.
    if "must be called before" not in str(e):
      raise
    logging.info("JAX already started in this process: running as a single process")
    return
  logging.info("Cluster detected by jax.distributed: process %d of %d", jax.process_index(),
               jax.process_count())


def set_cpu_devices(count: int) -> None:
  """Makes the CPU platform `count` XLA devices (<= 0: one per core this process may use).

  Call before JAX starts its backends. Decoding runs one search per device
  (`translation.translator.shard_search_fn`), and a search is a chain of small ops that keeps
  one core busy, so a device per core is what uses a CPU host (BENCHMARKS.md).
  A device count already in XLA_FLAGS wins; accelerators are not affected.
  """
  flag = "--xla_force_host_platform_device_count"
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if flag in xla_flags:
    return
  if count <= 0:
    count = host.usable_cores()
  os.environ["XLA_FLAGS"] = f"{xla_flags} {flag}={count}".strip()


def run_main(argv: list[str], work) -> None:
  """An entry point's body: no stray arguments, quiet libraries, known errors -> exit codes."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  host_allocator.reexec_with_reusable_malloc()
  setup_logging()
  # Silent here (an error must stay the only line); training's "Devices" line shows them.
  compilation.set_default_xla_flags()
  with exit_on_errors():
    work()


def run_training(config, workdir: str, *, launch: dict | None = None, coordinator_address=None,
                 num_processes=None, process_id=None) -> None:
  maybe_initialize_distributed(coordinator_address, num_processes, process_id)
  from flax_transformer.loop import train_and_evaluate  # decode.py never loads training.

  if jax.process_count() == 1:
    train_and_evaluate(config, workdir, launch)
    return
  training = threading.Event()
  training.set()
  threading.Thread(target=_exit_when_a_peer_is_lost, args=(training.is_set,), name="peer_watch",
                   daemon=True).start()
  try:
    train_and_evaluate(config, workdir, launch)
  except BaseException as e:
    if isinstance(e, (jax.errors.JaxRuntimeError, errors.CheckpointSaveError)):
      # A collective failed: most likely a peer died. Say so rather than the error.
      deadline = time.monotonic() + HEARTBEAT_TIMEOUT_S + 2 * PEER_POLL_S
      _exit_when_a_peer_is_lost(lambda: time.monotonic() < deadline)
    _leave(training, timeout_s=30.0)  # Errors raised everywhere (a bad config) leave too.
    raise
  _leave(training, barrier=True)


def _leave(training: threading.Event, barrier: bool = False, timeout_s: float = 600.0) -> None:
  """Leaves jax.distributed with process 0 (the coordination service's host) last.

  In recoverable mode jax.distributed's own shutdown barrier does not wait, so a
  process that left first would stop the service under the others' feet (a native
  abort in theirs). `barrier`: first wait until every process is done.
  """
  client = jax._src.distributed.global_state.client  # noqa: SLF001
  if barrier:
    client.wait_at_barrier("flax_transformer_done", int(timeout_s * 1000))
  training.clear()  # Peers leaving from here is no loss.
  if jax.process_index() != 0:
    jax.distributed.shutdown()
    return
  everyone = list(range(jax.process_count()))
  deadline = time.monotonic() + timeout_s
  while set(client.get_live_nodes(everyone)) - {0} and time.monotonic() < deadline:
    time.sleep(0.2)
  jax.distributed.shutdown()


def _exit_when_a_peer_is_lost(keep_watching: Callable[[], bool]) -> None:
  """Exits this process, with one line, once a peer process is gone; returns when
  `keep_watching()` turns false first.

  A collective whose peer died never completes, and jax.distributed would end the
  survivors itself only after its heartbeat timeout, with a native stack dump (or,
  had the collective failed, they would wait in its shutdown barrier as long). Here
  the coordination service (recoverable mode: it reports a dead task instead of
  aborting everyone) is asked every PEER_POLL_S which processes are alive.
  """
  while keep_watching():
    lost, detail = _lost_peers()
    if lost and keep_watching():
      _exit_lost(lost, detail)
    time.sleep(PEER_POLL_S)


def _lost_peers() -> tuple[list[int], str]:
  """The processes the coordination service no longer counts as alive, and why."""
  everyone = list(range(jax.process_count()))
  client = jax._src.distributed.global_state.client  # noqa: SLF001 (no public API)
  try:
    return sorted(set(everyone) - set(client.get_live_nodes(everyone))), "no heartbeat"
  except Exception as e:  # noqa: BLE001 -- the coordinator (process 0) is unreachable.
    return [0], (str(e).splitlines()[0][:200] if str(e) else type(e).__name__)


def _exit_lost(lost: list[int], detail: str) -> None:
  _report(f"process {jax.process_index()} of {jax.process_count()}: lost process "
          f"{', '.join(map(str, lost))} ({detail}); stopping. Relaunch every process: "
          "training resumes from the last complete checkpoint.")
  os._exit(EXIT_FAILED)  # Not sys.exit: the train step may hang in a collective.
