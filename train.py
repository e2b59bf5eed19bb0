"""Train a Transformer: python train.py --config=configs/multi30k.py --workdir=DIR.

Every config key can be overridden: --config.num_train_steps=1000. Bad
configs and data exit with code 2 and a message naming the problem.
"""

if __name__ == "__main__":  # First: glibc reads malloc settings at start, JAX not yet loaded.
  from flax_transformer import host_allocator

  host_allocator.reexec_with_reusable_malloc()

import datetime
import sys

from absl import app, flags
from ml_collections import config_flags

from flax_transformer.cli import common as cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py[:ARG]).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, vocabulary and metrics; "
                    "a rerun with the same workdir resumes.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process "
                    "runs (jax.distributed); unset: jax.distributed's cluster detection "
                    "(Cloud TPU VM slices, SLURM, Open MPI, Kubernetes), else one process.")
flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with --coordinator_address).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  launch = {"config_file": config_flags.get_config_filename(FLAGS["config"]),
            "overrides": config_flags.get_override_values(FLAGS["config"]),
            "argv": sys.argv, "started": datetime.datetime.now().astimezone().isoformat()}
  cli.run_main(argv, lambda: cli.run_training(
      FLAGS.config, FLAGS.workdir, launch=launch, coordinator_address=FLAGS.coordinator_address,
      num_processes=FLAGS.num_processes, process_id=FLAGS.process_id))
  cli.exit_without_teardown()  # Training ended (a stop by SIGTERM too) and all is closed.


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
