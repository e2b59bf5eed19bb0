"""What the entry points share: flags, logging set-up, errors -> exit codes."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from flax_transformer import compilation, errors, host
from flax_transformer.errors import EXIT_BAD_INPUT, EXIT_FAILED
from flax_transformer.training import distributed


@contextlib.contextmanager
def exit_on_errors():
  """Known problems become one line on stderr and an exit code, not a traceback."""
  try:
    yield
  except errors.BAD_INPUT as e:
    errors.report(e)
    sys.exit(EXIT_BAD_INPUT)
  except errors.RUN_FAILED as e:
    errors.report(e)
    sys.exit(EXIT_FAILED)


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


def set_cpu_devices(count: int) -> None:
  """Makes the CPU platform `count` XLA devices (<= 0: one per core this process may use).

  Call before JAX starts its backends. Decoding runs one search per device
  (`translation.programs.shard_search_fn`), and a search is a chain of small ops that keeps
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
  setup_logging()
  # Silent here (an error must stay the only line); training's "Devices" line shows them.
  compilation.set_default_xla_flags()
  with exit_on_errors():
    work()


def run_training(config, workdir: str, *, launch: dict | None = None, coordinator_address=None,
                 num_processes=None, process_id=None) -> None:
  distributed.initialize(coordinator_address, num_processes, process_id)
  from flax_transformer.loop import train_and_evaluate  # decode.py never loads training.

  distributed.run_watched(lambda: train_and_evaluate(config, workdir, launch))


def exit_without_teardown() -> None:
  """Ends the process as Python's exit does, without the interpreter's teardown.

  What Python runs at exit still runs: the threading module's exit hooks and the join
  of every non-daemon thread (threading._shutdown), then the atexit handlers (jax's
  clean-up, logging's flush, multiprocessing's children). Left out is freeing every
  module and object, and the native libraries' destructors: after a README-config
  SIGTERM stop (2 cores), 1.5 s of the 2.3 s from "Stopped" to the process gone
  (issue 68). For train.py once its run is closed: the checkpoint, metrics and input
  pipeline are by then.
  """
  import atexit
  import threading

  threading._shutdown()  # noqa: SLF001  (tests/test_private_apis.py checks it is there)
  atexit._run_exitfuncs()  # noqa: SLF001
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)
