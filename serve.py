"""Serve a trained workdir over HTTP: python serve.py --workdir=DIR [--port 8080]

POST /translate {"text": [...], "beam_size", "alpha", "nbest", "prefix"}, POST /score
{"source": [...], "target": [...]}, GET /health, a page at /, and LibreTranslate's API
(POST /translate with q, source, target; GET /languages) for its clients (docs/decoding.md).
Concurrent requests are searched together (dynamic batching); every search shape is
compiled before the server takes requests. Needs the `serve` extra (FastAPI, uvicorn).
"""

if __name__ == "__main__":  # First: glibc reads malloc settings at start, JAX not yet loaded.
  from flax_transformer import host_allocator

  host_allocator.reexec_with_reusable_malloc()

from absl import app, flags

from flax_transformer import compilation
from flax_transformer.cli import common as cli
from flax_transformer.cli import flags as shared
from flax_transformer.cli.serve import MIN_ALPHA_STEP, TOKEN_VARIABLE
from flax_transformer.translation.search_config import MAX_ALPHA

flags.DEFINE_string("workdir", None, "Training workdir (checkpoints, vocab.model, run.json).")
flags.DEFINE_list("ensemble", [], "More workdirs whose models vote with --workdir's, as in "
                  "decode.py.")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind; 0.0.0.0 serves other machines too.")
flags.DEFINE_integer("port", 8080, "TCP port (0: any free one; the line 'Serving ... on URL' "
                     "names it).", lower_bound=0, upper_bound=65535)
flags.DEFINE_string("token", None, "If set, every API call needs 'Authorization: Bearer TOKEN'. "
                    f"Default: the environment variable {TOKEN_VARIABLE} (out of ps and shell "
                    "history); this flag wins if given.")
shared.define_model_flags()
shared.define_search_flags("Default beam width of a request.")
flags.DEFINE_integer("max_beam", 8, "Largest beam_size a request may ask for.", lower_bound=1)
flags.DEFINE_integer("max_sentences", 64, "Most sentences in one request.", lower_bound=1)
flags.DEFINE_integer("max_chars", 5000, "LibreTranslate's --char-limit: most characters in one "
                     "of a request's q texts (over: a 400); -1: no limit. /frontend/settings "
                     "reports it as charLimit.", lower_bound=-1)
flags.DEFINE_integer("max_body_bytes", 1 << 20, "Largest request body (JSON or form) in bytes; "
                     "over: a 413. Bounds a request whatever --max_chars says.", lower_bound=1)
flags.DEFINE_integer("max_tokens", 64, "Longest source sentence in tokens (EOS included), "
                     "capped by the model's max_len; every width up to it is compiled at start.",
                     lower_bound=1)
flags.DEFINE_float("drain_s", 25.0, "On SIGTERM or Ctrl-C: seconds the requests in flight have "
                   "to be answered (new ones get 503) before the server stops; a second signal "
                   "stops it at once.", lower_bound=0.0)
flags.DEFINE_float("body_timeout_s", 10.0, "A request whose body has not arrived within this "
                   "many seconds gets a 408.", lower_bound=0.1)
flags.DEFINE_integer("max_batch", 64, "Most sentences searched together.", lower_bound=1)
flags.DEFINE_integer("max_configs", 8, "Search option sets (beam, alpha) kept compiled; beyond, "
                     "the least recently used idle one is dropped (one with requests waiting "
                     "never is).", lower_bound=1)
flags.DEFINE_float("max_wait_ms", 5.0, "How long the first waiting request waits for others "
                   "to join its batch.", lower_bound=0.0)
flags.DEFINE_list("languages", None, "SOURCE,TARGET: the one pair LibreTranslate's clients "
                  "see (GET /languages), for a workdir that records none (an older OPUS-MT "
                  "import). Default: the languages the workdir records (run.json's "
                  "'languages': every source with its targets; older workdirs their pair).")
flags.DEFINE_string("compilation_cache_dir", compilation.default_cache_dir(),
                    "jax's persistent compilation cache ('' = off).")
flags.DEFINE_integer("compilation_cache_max_mb", 2048, "Cap of the compilation cache's "
                     "entries, kept in its own folder DIR/serve: beyond, the least recently "
                     "used are deleted (0 = no cap, DIR itself). Each new option set a request "
                     "asks for adds its programs.", lower_bound=0)
flags.DEFINE_float("alpha_step", 0.1, "A request's alpha is rounded half up to a multiple of "
                   f"this (0 = as sent, else in [{MIN_ALPHA_STEP:g}, {MAX_ALPHA:g}]), at most "
                   f"{MAX_ALPHA:g}: every distinct alpha is a program to compile and keep. "
                   "--alpha must be on this grid.")
flags.adopt_module_key_flags(shared)  # --help lists them.
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv):
  def work():
    from flax_transformer.cli.serve import run_serve

    run_serve(workdir=FLAGS.workdir, ensemble=FLAGS.ensemble, host=FLAGS.host, port=FLAGS.port,
              token=FLAGS.token, search=shared.search_config(),  # The options' one check.
              average_last=FLAGS.average_last, checkpoint_step=FLAGS.checkpoint_step,
              floats={name: FLAGS[name].value for name in ("alpha_step", "drain_s",
                                                           "body_timeout_s", "max_wait_ms")},
              max_beam=FLAGS.max_beam, max_sentences=FLAGS.max_sentences,
              max_chars=FLAGS.max_chars, max_body_bytes=FLAGS.max_body_bytes,
              max_tokens=FLAGS.max_tokens, max_batch=FLAGS.max_batch,
              max_configs=FLAGS.max_configs, languages=FLAGS.languages,
              compilation_cache_dir=FLAGS.compilation_cache_dir,
              compilation_cache_max_mb=FLAGS.compilation_cache_max_mb)

  cli.set_cpu_devices(FLAGS.cpu_devices)
  cli.run_main(argv, work)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
