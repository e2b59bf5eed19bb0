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

import errno
import importlib.util
import math
import os
import socket

from absl import app, flags

from flax_transformer import compilation
from flax_transformer.cli import common as cli
from flax_transformer.errors import ConfigError
from flax_transformer.translation.search_config import MAX_ALPHA, SearchConfig

SEARCH = SearchConfig()
MIN_ALPHA_STEP = 0.001

flags.DEFINE_string("workdir", None, "Training workdir (checkpoints, vocab.model, run.json).")
flags.DEFINE_list("ensemble", [], "More workdirs whose models vote with --workdir's, as in "
                  "decode.py.")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind; 0.0.0.0 serves other machines too.")
flags.DEFINE_integer("port", 8080, "TCP port (0: any free one; the line 'Serving ... on URL' "
                     "names it).", lower_bound=0, upper_bound=65535)
TOKEN_VARIABLE = "SERVE_TOKEN"
flags.DEFINE_string("token", None, "If set, every API call needs 'Authorization: Bearer TOKEN'. "
                    f"Default: the environment variable {TOKEN_VARIABLE} (out of ps and shell "
                    "history); this flag wins if given.")
flags.DEFINE_integer("average_last", 5, "Average the last K checkpoints (as decode.py).",
                     lower_bound=1)
flags.DEFINE_integer("checkpoint_step", None, "Use this checkpoint step (default: newest).")
flags.DEFINE_integer("beam_size", SEARCH.beam_size, "Default beam width of a request.")
flags.DEFINE_float("alpha", SEARCH.alpha, "Default length penalty exponent of a request.")
flags.DEFINE_integer("max_extra", SEARCH.max_extra, "Longest output = source + max_extra tokens.")
flags.DEFINE_integer("max_beam", 8, "Largest beam_size a request may ask for.", lower_bound=1)
flags.DEFINE_integer("max_sentences", 64, "Most sentences in one request.", lower_bound=1)
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
flags.DEFINE_integer("cpu_devices", 0, "On a CPU host: devices to split each batch over "
                     "(0 = one per core), as decode.py.", lower_bound=0)
flags.DEFINE_list("languages", None, "SOURCE,TARGET language codes LibreTranslate's clients "
                  "see (GET /languages). Default: those the workdir records (its training "
                  "config's source_lang and target_lang, or an imported FSMT model's).")
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
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def _bind(host: str, port: int) -> socket.socket:
  """The listening socket, bound before loading: a taken port is named now, not after
  the searches have compiled, and nobody takes it meanwhile (requests sent while
  loading wait in its backlog)."""
  try:
    return socket.create_server(
        (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
  except OSError as e:
    reason = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
    raise ConfigError(f"--host {host} --port {port}: the address {reason}") from None


def _check_floats(on_grid) -> None:
  """What absl's bounds let through: nan (no comparison fails) and inf (--alpha: SearchConfig);
  an --alpha off --alpha_step's grid (a request sending the default alpha would get another)."""
  for name in ("alpha_step", "drain_s", "body_timeout_s", "max_wait_ms"):
    if not math.isfinite(FLAGS[name].value):
      raise ConfigError(f"--{name} must be a finite number, got {FLAGS[name].value}")
  # Here, not absl's bounds: one line. Below 0.001 the grid bounds nothing, and decimal
  # rounding runs out of digits (1e-30).
  if FLAGS.alpha_step and not MIN_ALPHA_STEP <= FLAGS.alpha_step <= MAX_ALPHA:
    raise ConfigError(f"--alpha_step must be in [{MIN_ALPHA_STEP:g}, {MAX_ALPHA:g}], or 0 for "
                      f"alphas as sent, got {FLAGS.alpha_step:g}")
  rounded = on_grid(FLAGS.alpha, FLAGS.alpha_step)
  if rounded != FLAGS.alpha:
    raise ConfigError(f"--alpha {FLAGS.alpha:g} is off --alpha_step {FLAGS.alpha_step:g}'s grid "
                      f"(a request's alpha {FLAGS.alpha:g} would be searched as {rounded:g}): "
                      "give an --alpha on it, or another --alpha_step (0: alphas as sent)")


def main(argv):
  def work():
    try:
      from flax_transformer.serving import drain
      from flax_transformer.serving.app import Limits, make_app, on_grid
      from flax_transformer.serving.batcher import Batcher
      if not any(importlib.util.find_spec(m) for m in ("python_multipart", "multipart")):
        raise ImportError("No module named 'python_multipart'")  # LibreTranslate's forms.
    except ImportError as e:
      raise ConfigError(f"serve.py needs FastAPI, uvicorn and python-multipart ({e}): "
                        "pip install -e '.[serve]'")
    from flax_transformer import workdir as workdir_lib
    from flax_transformer.translation.translator import Translator

    # The search options' one check (decode.py's and export.py's too) comes first.
    search = SearchConfig(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha, max_extra=FLAGS.max_extra)
    _check_floats(on_grid)
    if FLAGS.languages is not None and (len(FLAGS.languages) != 2
                                        or not all(c.strip() for c in FLAGS.languages)):
      raise ConfigError(f"--languages takes SOURCE,TARGET (two codes, as en,de), got "
                        f"{','.join(FLAGS.languages)!r}")
    if search.beam_size > FLAGS.max_beam:  # Else every request without a beam_size is a 422.
      raise ConfigError(f"--beam_size {search.beam_size} is over --max_beam {FLAGS.max_beam}")
    listening = _bind(FLAGS.host, FLAGS.port)
    translator = Translator.from_workdir(FLAGS.workdir, search=search, ensemble=FLAGS.ensemble,
                                         average_last=FLAGS.average_last,
                                         checkpoint_step=FLAGS.checkpoint_step)
    cache_dir = FLAGS.compilation_cache_dir
    if cache_dir and FLAGS.compilation_cache_max_mb:  # jax's eviction needs every writer capped.
      cache_dir = os.path.join(cache_dir, "serve")
    compilation.enable_cache(cache_dir, FLAGS.compilation_cache_max_mb << 20)  # Before compiles.
    batcher = Batcher(translator, max_batch=FLAGS.max_batch, max_wait_s=FLAGS.max_wait_ms / 1000,
                      max_tokens=FLAGS.max_tokens, max_configs=FLAGS.max_configs)
    batcher.warm()
    limits = Limits(max_sentences=FLAGS.max_sentences, max_beam=FLAGS.max_beam,
                    body_timeout_s=FLAGS.body_timeout_s, alpha_step=FLAGS.alpha_step)
    token = (FLAGS.token if FLAGS.token is not None else os.environ.get(TOKEN_VARIABLE)) or None
    in_flight = drain.Drain()
    languages = tuple(FLAGS.languages or ()) or workdir_lib.language_pair(FLAGS.workdir)
    server = make_app(translator, batcher, workdir=FLAGS.workdir, token=token, limits=limits,
                      drain=in_flight, languages=languages)
    port = listening.getsockname()[1]
    print(f"Serving {FLAGS.workdir} on http://{FLAGS.host}:{port}/", flush=True)
    drain.run(server, [listening], in_flight, FLAGS.drain_s)

  cli.set_cpu_devices(FLAGS.cpu_devices)
  cli.run_main(argv, work)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags_or_exit)
