"""Average a workdir's last K checkpoints into a new workdir (paper: K=5 base, 20 big).

python average_checkpoints.py --workdir=DIR --last=5 --output=DIR_avg5
then: python decode.py --workdir=DIR_avg5 ...  (decode.py --average_last=K does
the same on the fly, without writing anything).
"""

if __name__ == "__main__":  # First: glibc reads malloc settings at start, JAX not yet loaded.
  from flax_transformer import host_allocator

  host_allocator.reexec_with_reusable_malloc()

from absl import app, flags

from flax_transformer.cli import common as cli

flags.DEFINE_string("workdir", None, "Training workdir holding the checkpoints.")
flags.DEFINE_integer("last", 5, "How many of the newest checkpoints to average.")
flags.DEFINE_string("output", None, "New directory for the averaged checkpoint.")
flags.mark_flags_as_required(["workdir", "output"])
FLAGS = flags.FLAGS


def main(argv):
  def work():
    from flax_transformer.averaging import write_averaged

    steps = write_averaged(FLAGS.workdir, FLAGS.output, FLAGS.last)
    print(f"averaged steps {steps} -> {FLAGS.output}")

  cli.run_main(argv, work)

if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
