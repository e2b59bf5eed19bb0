"""Prepare a config's datasets once, before training: python prepare_data.py --config=configs/base.py.

For tfds builders (WMT14) this downloads the source archives (or takes them from
--config.manual_dir), checks them against tfds's registered checksums and writes
array_record into --config.data_dir. train.py would do the same on its first
launch; doing it here first keeps the processes of a multi-host run from racing.
"""

if __name__ == "__main__":  # First: glibc reads malloc settings at start, JAX not yet loaded.
  from flax_transformer import host_allocator

  host_allocator.reexec_with_reusable_malloc()

from absl import app, flags
from ml_collections import config_flags

from flax_transformer.cli import common as cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py[:ARG]).",
                                lock_config=True)
flags.mark_flags_as_required(["config"])


def main(argv):
  def work():
    from flax_transformer.data import sources

    for line in sources.prepare_datasets(FLAGS.config):
      print(line)

  cli.run_main(argv, work)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
