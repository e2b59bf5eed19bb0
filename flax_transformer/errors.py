"""Every error the package raises on purpose, the exit code each means, and how it is told.

Known problems reach the user as one line naming what to fix (cli.exit_on_errors);
anything else is a bug and keeps its traceback.
"""

import sys

EXIT_BAD_INPUT = 2  # Bad config, data, workdir: the message says what to fix.
EXIT_FAILED = 1  # The run itself failed (the loss diverged, a checkpoint could not be written).
EXIT_FORCED = 130  # 128 + SIGINT: a second Ctrl-C ended training at once (stop_request).


class ConfigError(ValueError):
  """A config value that cannot work; the message names the key and the fix."""


class ShardingConfigError(ConfigError):
  """A mesh or batch setting that cannot work; the message names key and fix."""


class DataError(ValueError):
  """Bad or missing input data; the message names the file (and line)."""


class CheckpointError(RuntimeError):
  """Checkpoints exist but none can be used; the message says what was wrong."""


class WorkdirGoneError(RuntimeError):
  """The workdir was deleted or replaced under a running job."""


class WorkdirBusyError(RuntimeError):
  """Another launch holds the workdir (its lock is fresh); the message names it."""


class CheckpointSaveError(RuntimeError):
  """Writing a checkpoint failed (disk full, unwritable directory); older ones are intact."""


class WorkdirWriteError(RuntimeError):
  """Writing a workdir's record (run.json) failed; the previous version is intact."""


class ExportWriteError(RuntimeError):
  """Writing export.py's folder failed; a previous export there is intact."""


class NonFiniteLossError(RuntimeError):
  """The loss became NaN or infinite."""


BAD_INPUT = (ConfigError, ShardingConfigError, DataError, CheckpointError, WorkdirGoneError,
             WorkdirBusyError, FileNotFoundError)
RUN_FAILED = (NonFiniteLossError, CheckpointSaveError, WorkdirWriteError, ExportWriteError)


def report(error) -> None:
  """Writes `error: <error>` to stderr as one line.

  One write, starting on a fresh line: orbax's save threads may still be printing
  their own tracebacks, and `print` writes the text and its newline separately, so
  its line could be split or land behind a half-written one (seen in CI).
  """
  sys.stderr.write(f"\nerror: {error}\n")
  sys.stderr.flush()
