"""serve.py's work: the search options checked, the port bound, the model loaded, every
shape compiled, then the HTTP app served until SIGTERM or Ctrl-C (`serving.drain`)."""

from __future__ import annotations

import errno
import importlib.util
import math
import os
import socket
from typing import Sequence

from flax_transformer import compilation
from flax_transformer.errors import ConfigError
from flax_transformer.translation.search_config import MAX_ALPHA, SearchConfig

TOKEN_VARIABLE = "SERVE_TOKEN"  # The token's environment variable (out of ps and history).
MIN_ALPHA_STEP = 0.001


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


def check_floats(floats: dict[str, float], alpha: float, on_grid) -> None:
  """What absl's bounds let through: nan (no comparison fails) and inf (--alpha: SearchConfig);
  an --alpha off --alpha_step's grid (a request sending the default alpha would get another).
  floats: flag name -> value (alpha_step, drain_s, body_timeout_s, max_wait_ms)."""
  for name, value in floats.items():
    if not math.isfinite(value):
      raise ConfigError(f"--{name} must be a finite number, got {value}")
  # Here, not absl's bounds: one line. Below 0.001 the grid bounds nothing, and decimal
  # rounding runs out of digits (1e-30).
  alpha_step = floats["alpha_step"]
  if alpha_step and not MIN_ALPHA_STEP <= alpha_step <= MAX_ALPHA:
    raise ConfigError(f"--alpha_step must be in [{MIN_ALPHA_STEP:g}, {MAX_ALPHA:g}], or 0 for "
                      f"alphas as sent, got {alpha_step:g}")
  rounded = on_grid(alpha, alpha_step)
  if rounded != alpha:
    raise ConfigError(f"--alpha {alpha:g} is off --alpha_step {alpha_step:g}'s grid "
                      f"(a request's alpha {alpha:g} would be searched as {rounded:g}): "
                      "give an --alpha on it, or another --alpha_step (0: alphas as sent)")


def _check_serving_installed() -> None:
  """FastAPI, uvicorn, python-multipart (LibreTranslate's forms) and html5lib (format=html),
  or one install line."""
  try:
    from flax_transformer.serving import app, drain  # noqa: F401
    from flax_transformer.serving import batcher  # noqa: F401
    if not any(importlib.util.find_spec(m) for m in ("python_multipart", "multipart")):
      raise ImportError("No module named 'python_multipart'")
  except ImportError as e:
    raise ConfigError(f"serve.py needs FastAPI, uvicorn, python-multipart and html5lib ({e}): "
                      "pip install -e '.[serve]'")


def _check_pair(workdir: str, languages: Sequence[str]) -> None:
  """--languages: two codes, and a pair the workdir's model translates where its record
  states its languages (else every request would reach the model and fail: a 500)."""
  if len(languages) != 2 or not all(c.strip() for c in languages):
    raise ConfigError(f"--languages takes SOURCE,TARGET (two codes, as en,de), got "
                      f"{','.join(languages)!r}")
  from flax_transformer import workdir as workdir_lib

  try:
    workdir_lib.languages(workdir).check_pair(*languages)
  except ConfigError as e:  # UnknownLanguageError: one line naming the pairs it knows.
    raise ConfigError(f"--languages={','.join(languages)}: {e}") from None


def run_serve(*, workdir: str, ensemble: Sequence[str], host: str, port: int,
              token: str | None, search: SearchConfig, average_last: int | None,
              checkpoint_step: int | None, floats: dict[str, float], max_beam: int,
              max_sentences: int, max_chars: int, max_body_bytes: int, max_tokens: int,
              max_batch: int, max_configs: int,
              languages: Sequence[str] | None, compilation_cache_dir: str,
              compilation_cache_max_mb: int) -> None:
  """serve.py's body, its flags as arguments (floats: as `check_floats`')."""
  _check_serving_installed()
  from flax_transformer.serving import drain
  from flax_transformer.serving.app import Limits, make_app, on_grid
  from flax_transformer.serving.batcher import Batcher
  from flax_transformer.translation.translator import Translator

  check_floats(floats, search.alpha, on_grid)
  if languages is not None:
    _check_pair(workdir, languages)
  if max_chars == 0:  # absl's bound lets it through; every text would be refused.
    raise ConfigError("--max_chars must be at least 1, or -1 for no limit, got 0")
  if search.beam_size > max_beam:  # Else every request without a beam_size is a 422.
    raise ConfigError(f"--beam_size {search.beam_size} is over --max_beam {max_beam}")
  listening = _bind(host, port)
  translator = Translator.from_workdir(workdir, search=search, ensemble=ensemble,
                                       average_last=average_last, checkpoint_step=checkpoint_step)
  cache_dir = compilation_cache_dir
  if cache_dir and compilation_cache_max_mb:  # jax's eviction needs every writer capped.
    cache_dir = os.path.join(cache_dir, "serve")
  compilation.enable_cache(cache_dir, compilation_cache_max_mb << 20)  # Before compiles.
  batcher = Batcher(translator, max_batch=max_batch, max_wait_s=floats["max_wait_ms"] / 1000,
                    max_tokens=max_tokens, max_configs=max_configs)
  batcher.check_fits(search)  # Warming compiles every shape: none that cannot fit.
  batcher.warm()
  limits = Limits(max_sentences=max_sentences, max_chars=max_chars, max_beam=max_beam,
                  max_body_bytes=max_body_bytes,
                  body_timeout_s=floats["body_timeout_s"], alpha_step=floats["alpha_step"])
  token = (token if token is not None else os.environ.get(TOKEN_VARIABLE)) or None
  in_flight = drain.Drain()
  languages = tuple(languages) if languages else None  # None: the workdir's record.
  server = make_app(translator, batcher, workdir=workdir, token=token, limits=limits,
                    drain=in_flight, languages=languages)
  print(f"Serving {workdir} on http://{host}:{listening.getsockname()[1]}/", flush=True)
  drain.run(server, [listening], in_flight, floats["drain_s"])
