"""Import a pretrained translation model: python import_model.py --from=DIR --workdir=W

DIR is a transformers-format folder (config.json, model.safetensors and the tokenizer's
files) of a Marian (OPUS-MT), FSMT (fairseq's WMT19) or M2M100 / NLLB-200 model (their
tensors read one at a time; --dtype=stored keeps bf16/fp16 as stored). W becomes a workdir that decode.py, serve.py,
export.py, average_checkpoints.py and Translator.from_workdir use as they use one trained
here; its run.json names DIR and the sha256 of its files. A folder of another
architecture, a missing file, or a config field with no equivalent here is one line on
stderr and exit 2. See docs/pretrained.md.
"""

# No host_allocator re-exec here (train/decode/serve have one): an import runs no XLA steps,
# and its malloc settings (no trimming, no mmap) kept every freed tensor's pages: peak RSS
# 9.3 GB instead of 6.6 GB before the checkpoint write changed (bench/import_memory.py).
from absl import app, flags

from flax_transformer.cli import common as cli

flags.DEFINE_string("from", None, "The transformers-format model folder to import.")
flags.DEFINE_string("workdir", None, "The new workdir (absent or empty).")
flags.DEFINE_enum("dtype", "float32", ["float32", "stored"],
                  "Parameters' dtype: float32 (bf16/fp16 tensors cast), or as model.safetensors "
                  "stores them (one dtype; M2M100/NLLB).")
flags.mark_flags_as_required(["from", "workdir"])
FLAGS = flags.FLAGS


def main(argv):
  def work():
    from flax_transformer.pretrained import importer

    importer.import_model(getattr(FLAGS, "from"), FLAGS.workdir, FLAGS.dtype)

  cli.run_main(argv, work)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
