"""Export a trained workdir for use without this package.

  python export.py --workdir=DIR --out=EXPORT [--format=stablehlo]
      StableHLO (jax.export) of the averaged model's encoder and beam search, one
      module per batch shape, with params.npz, vocab.model, manifest.json and
      translate.py, a runner that needs jax, numpy and sentencepiece only:
      python EXPORT/translate.py < in.en > out.de
  python export.py --workdir=DIR --out=CT2 --format=ctranslate2 [--quantization=int8]
      A CTranslate2 model directory (pip install -e '.[ctranslate2]') with the same
      translate.py, which then needs ctranslate2 and sentencepiece only. An imported
      M2M100 / NLLB-200 workdir: its sentencepiece.bpe.model and languages record
      instead of translate.py (ctranslate2.Translator with target_prefix=[[token]]:
      docs/pretrained.md).
  python export.py --workdir=DIR --out=HF --format=transformers
      A transformers MarianMTModel folder (config.json, model.safetensors, source.spm,
      target.spm, vocab.json, tokenizer_config.json): MarianMTModel.from_pretrained(HF),
      MarianTokenizer.from_pretrained(HF). What cannot be expressed is refused. A run on
      several languages: manifest.json's languages record names each target's token,
      given to generate as decoder_input_ids (docs/decoding.md).
      A workdir imported from an M2M100 / NLLB-200 folder goes out as one again
      (M2M100ForConditionalGeneration: config.json, model.safetensors without the
      import's vocabulary padding, sentencepiece.bpe.model, tokenizer_config.json).
"""

if __name__ == "__main__":  # First: glibc reads malloc settings at start, JAX not yet loaded.
  from flax_transformer import host_allocator

  host_allocator.reexec_with_reusable_malloc()

from absl import app, flags

from flax_transformer.cli import common as cli
from flax_transformer.cli import flags as shared

flags.DEFINE_string("workdir", None, "Training workdir (checkpoints, vocab.model, run.json).")
flags.DEFINE_string("out", None, "Folder to write (must be empty or absent).")
flags.DEFINE_enum("format", "stablehlo", ["stablehlo", "ctranslate2", "transformers"],
                  "What to write.")
shared.define_search_flags(
    "Beam width (paper: 4; 1 = greedy): baked into StableHLO, translate.py's default for "
    "CTranslate2, num_beams for transformers.")
flags.DEFINE_integer("batch_tokens", 4096, "StableHLO: decode.py's --batch_tokens; with the "
                     "device count it fixes the exported batch shapes.")
shared.define_model_flags("StableHLO: the shapes decode.py's would have.")
flags.DEFINE_list("platforms", ["cpu"], "StableHLO: jax.export platforms (cpu, cuda, tpu).")
flags.DEFINE_enum("quantization", "float32", ["float32", "int8", "int8_float32", "int16",
                                              "float16", "bfloat16"],
                  "CTranslate2: weight type on disk.")
flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out (refused if "
                  "it holds files its manifest does not list).")
flags.adopt_module_key_flags(shared)  # --help lists them.
flags.mark_flags_as_required(["workdir", "out"])
FLAGS = flags.FLAGS


def main(argv):
  def work():
    from flax_transformer.cli.export import run_export

    run_export(workdir=FLAGS.workdir, out=FLAGS.out, fmt=FLAGS.format,
               search=shared.search_config(),
               batch_tokens=FLAGS.batch_tokens, average_last=FLAGS.average_last,
               checkpoint_step=FLAGS.checkpoint_step, platforms=FLAGS.platforms,
               quantization=FLAGS.quantization, overwrite=FLAGS.overwrite)

  cli.set_cpu_devices(FLAGS.cpu_devices)
  cli.run_main(argv, work)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
