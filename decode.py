"""Translate with a trained workdir: python decode.py --workdir=DIR < in.en > out.de

Reads the model config and vocabulary from the workdir. Writes exactly one
output line per input line (empty in, empty out), ending as the input line did
(CRLF in a Windows file); with --nbest=K, K lines per input as
'index ||| translation ||| score'. Progress goes to stderr.

--prefix=FILE (one line per input line): each translation starts with its line
(tokenized as targets are; an empty line forces nothing), the search goes on
from there, and the score counts the prefix's log-probability too.
--score=TARGETS (one target per input line): translates nothing; writes per
pair 'logprob<TAB>tokens', the target's log-probability under the model (or
ensemble) summed over its tokens (natural log) and the token count, EOS
included: logprob / tokens is the mean per token.
--interactive (the default when stdin is a terminal and no --reference, --score,
--prefix or --attention_plot is given; --nointeractive turns it off): each stdin line
is translated and written, flushed, as soon as it is read.
"""

if __name__ == "__main__":  # First: glibc reads malloc settings at start, JAX not yet loaded.
  from flax_transformer import host_allocator

  host_allocator.reexec_with_reusable_malloc()

from absl import app, flags

from flax_transformer import compilation
from flax_transformer.cli import common as cli
from flax_transformer.cli import flags as shared

SEARCH = shared.SEARCH  # The defaults.

flags.DEFINE_string("workdir", None, "Training workdir (checkpoints, vocab.model, run.json).")
flags.DEFINE_list("ensemble", [], "More workdirs (comma-separated) whose models vote with "
                  "--workdir's: each step uses the mean of the models' probabilities. All "
                  "must share --workdir's vocabulary; --average_last and --checkpoint_step "
                  "apply to each.")
flags.DEFINE_string("input", "-", "File of sentences, one per line; '-' = stdin.")
flags.DEFINE_string("output", "-", "Where translations go, one per line; '-' = stdout.")
flags.DEFINE_string("prefix", None, "File of target prefixes, one per input line: each "
                    "translation starts with its line (empty: no prefix), then the search "
                    "goes on (beam, n-best and sampling alike).")
flags.DEFINE_string("score", None, "File of targets, one per input line: instead of "
                    "translating, write per pair 'logprob<TAB>tokens', the target's natural-log "
                    "probability summed over its tokens and their count, EOS included.")
# Search flags: their defaults are SearchConfig's, the one place they are set.
shared.define_search_flags()
flags.DEFINE_integer("batch_tokens", 4096, "Source tokens per batch (sentences are sorted by "
                     "length into batches and output in input order).")
flags.DEFINE_integer("nbest", SEARCH.nbest, "Hypotheses per sentence (<= beam_size).")
flags.DEFINE_bool("eos_within_beam", SEARCH.eos_within_beam, "Beam search: a hypothesis ends "
                  "only as one of a step's beam_size best candidates (transformers' and "
                  "fairseq's rule; docs/pretrained.md), not as any of the 2 x beam_size.")
flags.DEFINE_float("temperature", SEARCH.temperature, "> 0: sample instead of beam search.")
flags.DEFINE_integer("top_k", SEARCH.top_k, "Sampling: keep the k most likely tokens (0 = all).")
flags.DEFINE_float("top_p", SEARCH.top_p,
                   "Sampling: keep the smallest set of tokens with mass >= p.")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
shared.define_model_flags()
flags.DEFINE_string("source_lang", None, "The inputs' language, where the model translates "
                    "from several (run.json's 'languages'); default: its only one.")
flags.DEFINE_string("target_lang", None, "The language to translate into, where the model "
                    "translates into several; default: its only one.")
flags.DEFINE_string("reference", None, "Reference translations, one per line: print scores.")
flags.DEFINE_list("metrics", ["bleu", "chrf", "ter"], "Scores with --reference (sacrebleu).")
flags.DEFINE_string("sacrebleu_tokenize", None, "sacrebleu BLEU tokenizer (13a, intl, ...).")
flags.DEFINE_string("attention_plot", None, "PNG path: attention heads (last layers) for the "
                    "first sentence, or see --attention_sentences.")
flags.DEFINE_integer("attention_sentences", 1, "With --attention_plot: plot the first N non-empty "
                     "input lines, one PNG each named <stem>_<line number>.png when N > 1.",
                     lower_bound=1)
flags.DEFINE_string("compilation_cache_dir", compilation.default_cache_dir(),
                    "jax's persistent compilation cache: a second run with the same shapes "
                    "loads its searches instead of compiling them; '' = off.")
flags.DEFINE_bool("split_sentences", False, "Each input line is a text: split into sentences "
                  "(sentencex, the workdir's source language), translated, joined back on "
                  "its line; off: a line is one input (line-aligned files).")
flags.DEFINE_bool("interactive", False, "Translate stdin line by line, each line written and "
                  "flushed as soon as it is read (the default when stdin is a terminal and no "
                  "batch-only flag is given; --nointeractive: read the whole input).")
flags.adopt_module_key_flags(shared)  # --help lists them.
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
  def work():
    from flax_transformer.cli import interactive
    from flax_transformer.cli.translate import run_decode

    search = shared.search_config(nbest=FLAGS.nbest, temperature=FLAGS.temperature,
                                  top_k=FLAGS.top_k, top_p=FLAGS.top_p,
                                  eos_within_beam=FLAGS.eos_within_beam)
    batch_only = {"--reference": FLAGS.reference, "--attention_plot": FLAGS.attention_plot,
                  "--prefix": FLAGS.prefix, "--score": FLAGS.score}
    asked = FLAGS.interactive if FLAGS["interactive"].present else None
    if interactive.wanted(asked, FLAGS.input, batch_only=batch_only.values()):
      interactive.check_flags(**{"--input": FLAGS.input != "-", **batch_only})
      interactive.run_interactive(
          workdir=FLAGS.workdir, output_path=FLAGS.output, search=search, seed=FLAGS.seed,
          compilation_cache_dir=FLAGS.compilation_cache_dir, average_last=FLAGS.average_last,
          checkpoint_step=FLAGS.checkpoint_step, ensemble=FLAGS.ensemble,
          source_lang=FLAGS.source_lang, target_lang=FLAGS.target_lang,
          split_sentences=FLAGS.split_sentences)
      return
    run_decode(workdir=FLAGS.workdir, input_path=FLAGS.input, output_path=FLAGS.output,
               reference=FLAGS.reference, metrics=FLAGS.metrics,
               sacrebleu_tokenize=FLAGS.sacrebleu_tokenize,
               attention_plot=FLAGS.attention_plot,
               attention_sentences=FLAGS.attention_sentences,
               compilation_cache_dir=FLAGS.compilation_cache_dir, search=search,
               batch_tokens=FLAGS.batch_tokens, seed=FLAGS.seed,
               average_last=FLAGS.average_last, checkpoint_step=FLAGS.checkpoint_step,
               ensemble=FLAGS.ensemble, prefix_path=FLAGS.prefix, score_path=FLAGS.score,
               split_sentences=FLAGS.split_sentences, source_lang=FLAGS.source_lang,
               target_lang=FLAGS.target_lang)

  cli.set_cpu_devices(FLAGS.cpu_devices)
  cli.run_main(argv, work)

if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
