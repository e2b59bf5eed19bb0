"""How to search: `SearchConfig`, the one check of the search options (beam size, length
penalty, sampling), shared by decode.py, serve.py, export.py, the server's requests and the API.
"""

import dataclasses
import numbers

import numpy as np

from flax_transformer.errors import ConfigError


MAX_ALPHA = 10.0
TEMPERATURES = (1e-3, 100.0)  # A sampling temperature's range.


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """How to search: beam (beam_size > 1 or temperature 0 with beam_size 1) or sampling.

  max_extra: outputs may be up to source length + max_extra tokens (paper: 50; 0: no
  longer than the source), capped by the model's max_len. nbest: hypotheses returned
  per sentence (1 when sampling: a draw is one hypothesis).

  The one check of search options (decode.py's, serve.py's and export.py's flags,
  serve's requests, the API): an option out of range is a ConfigError naming it.
  alpha in [0, 10]: below 0 the early stop's bound on live beams fails (a sentence's
  n-best could depend on its batch-mates), so it is refused, not searched; 10 keeps
  ((5 + |Y|) / 6)^alpha finite in float32 for outputs of thousands of tokens.
  temperature 0 (beam search, or greedy with beam_size 1) or in [0.001, 100]: below,
  sampling is all but greedy; above, all but uniform over the vocabulary (and from
  about 1e5 the pad and length bans, log-prob -1e7 divided by the temperature, fail).
  top_k in [0, the vocabulary] (0: every token; the vocabulary's bound is
  `check_vocabulary`'s), top_p in (0, 1].
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_extra: int = 50
  nbest: int = 1
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  # Beam search: a hypothesis ends (takes EOS) only as one of a step's beam_size best
  # candidates, as transformers' generate and fairseq have it; False: as any of the
  # 2 x beam_size the step considers (search.beam_search).
  eos_within_beam: bool = False

  def __post_init__(self):
    self._check_types()
    # `not a <= x <= b`, not `x < a or x > b`: NaN is refused too.
    if not self.beam_size >= 1:
      raise ConfigError(f"beam_size must be >= 1, got {self.beam_size}")
    if not 1 <= self.nbest <= self.beam_size:
      raise ConfigError(f"nbest must be in [1, beam_size={self.beam_size}], got {self.nbest}")
    if not 0 <= self.alpha <= MAX_ALPHA:
      raise ConfigError(f"alpha must be in [0, {MAX_ALPHA:g}], got {self.alpha}")
    if not self.max_extra >= 0:
      raise ConfigError(f"max_extra must be >= 0, got {self.max_extra}")
    if not (self.temperature == 0 or TEMPERATURES[0] <= self.temperature <= TEMPERATURES[1]):
      raise ConfigError(f"temperature must be 0 (beam search; greedy with beam_size 1) or in "
                        f"[{TEMPERATURES[0]:g}, {TEMPERATURES[1]:g}], got {self.temperature}")
    if self.temperature > 0 and self.nbest > 1:
      raise ConfigError(f"nbest must be 1 when sampling (temperature > 0): each draw is one "
                        f"hypothesis, got {self.nbest}")
    if not self.top_k >= 0:
      raise ConfigError(f"top_k must be >= 0 (0 = every token), got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

  def _check_types(self) -> None:
    """Each option of its declared type: an int field takes integers (numpy's too), not
    bools or 2.5 (a beam of 2.5 fails deep in JAX, True searches a beam of 1); a float
    field real numbers, not bools; a bool field True or False. Each is kept as that
    Python type."""
    kinds = {int: (numbers.Integral, "an integer"), float: (numbers.Real, "a number"),
             bool: ((bool, np.bool_), "True or False")}
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      kind, expected = kinds[field.type]
      is_bool = isinstance(value, (bool, np.bool_))
      if not isinstance(value, kind) or is_bool != (field.type is bool):
        raise ConfigError(f"{field.name} must be {expected}, got {value!r} "
                          f"({type(value).__name__})")
      # As Python's own type: numpy's narrow integers would wrap or overflow in the
      # checks' products (np.uint8(4) x a vocabulary of 511), a Fraction reach JAX.
      try:
        object.__setattr__(self, field.name, field.type(value))
      except OverflowError:  # alpha=10**400: kept, for its range check to name it.
        pass

  def check_vocabulary(self, vocab_size: int) -> None:
    """The checks that need the model: top_k at most its vocabulary; a beam search's
    candidates (beam x vocabulary per sentence) within its int32 indices."""
    if (self.temperature == 0 and self.beam_size > 1
        and self.beam_size * vocab_size > np.iinfo(np.int32).max):
      raise ConfigError(f"beam_size={self.beam_size} x the vocabulary's {vocab_size} tokens "
                        "is over 2^31 - 1 candidates per sentence (the search's int32 indices)")
    if self.top_k > vocab_size:
      raise ConfigError(f"top_k must be at most the vocabulary's {vocab_size} tokens "
                        f"(0 = every token), got {self.top_k}")
