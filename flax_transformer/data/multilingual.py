"""One model for many directions (issue 76): the pairs of every direction between
`config.languages`, each target marked by its language's token, mixed by temperature.

Each target text starts with its language's token (languages.target_piece: '<2de> ...',
a user-defined symbol of the shared vocabulary, which sentencepiece keeps whole), so the
decoder's first outputs name the target; translation forces them (translation/directions.py,
target_by 'decoder_prefix'). Directions are sampled with probability proportional to
n_pair ** (1 / pair_temperature) (Arivazhagan et al. 2019's temperature sampling: 1 keeps
the corpora's proportions, larger flattens them towards uniform): each direction's
examples are repeated or subsampled (a fixed permutation) to its share of the total, and
the pipeline's shuffle mixes directions within every batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from flax_transformer import language_codes
from flax_transformer.errors import ConfigError
from flax_transformer.languages import Languages, from_config, parse_codes


def of_model(config, model: Languages) -> Languages:
  """The languages a fine-tuning run (config.init_from) trains between: config.languages'
  codes (the model's own, as eng_Latn, or their ISO 639 forms, as en) resolved to the
  model's codes, each marked with the model's own tokens (an imported NLLB/M2M100's
  language codes, the source's too), not '<2xx>'. A ConfigError names a code the model
  does not know, or a model that does not take its target from a decoder prefix."""
  where = f"--config.languages={config.languages!r}"
  if model.target_by != "decoder_prefix":
    raise ConfigError(f"{where}: the init_from model's languages record has target_by="
                      f"{model.target_by!r}; config.languages fine-tunes a model whose "
                      "target token starts the decoder (decoder_prefix)")
  codes = []
  for code in parse_codes(config.languages, where):
    known = language_codes.resolve(code, model.targets)
    if known is None:
      raise ConfigError(f"{where}: {code!r} is not one of the init_from model's languages "
                        f"({', '.join(model.targets)})")
    codes.append(known)
  codes = tuple(codes)
  return Languages(sources=codes, targets=codes, target_by=model.target_by,
                   target_tokens={c: model.target_tokens[c] for c in codes},
                   source_tokens={c: model.source_tokens[c] for c in codes
                                  if c in model.source_tokens})


def directions(config) -> list[tuple[str, str]]:
  """The (source, target) pairs a multilingual config trains."""
  languages = from_config(config)
  return languages.pairs() if languages is not None else []


def pieces(config) -> list[str]:
  """The target tokens the vocabulary must keep whole (user-defined symbols)."""
  languages = from_config(config)
  if languages is None or languages.target_by != "decoder_prefix":
    return []
  return [languages.target_tokens[code] for code in languages.targets]


def shares(sizes: Sequence[int], temperature: float) -> list[int]:
  """Examples each direction contributes to one pass: sum(sizes) split in proportion to
  size ** (1 / temperature), each at least one."""
  if not temperature > 0:
    raise ConfigError(f"config.pair_temperature={temperature!r}: must be > 0 (1 = the "
                      "corpora's proportions, 5 = close to uniform)")
  weights = np.asarray(sizes, np.float64) ** (1.0 / temperature)
  weights /= weights.sum()
  return [max(1, int(round(w * sum(sizes)))) for w in weights]


class MultilingualPairs(Sequence):
  """The pairs of several directions, targets marked, each direction at its share."""

  def __init__(self, by_direction: dict[tuple[str, str], Sequence], languages: Languages,
               temperature: float, seed: int = 0):
    self.parts = list(by_direction.items())
    self.languages = languages
    counts = shares([len(p) for _, p in self.parts], temperature)
    rng = np.random.default_rng(seed)
    self.index = []  # (direction, example) per item.
    for d, ((_, pairs), count) in enumerate(zip(self.parts, counts)):
      order = rng.permutation(len(pairs))
      taken = list(itertools.islice(itertools.cycle(order), count))
      self.index += [(d, int(i)) for i in taken]
    self.name = "+".join(f"{s}-{t}" for (s, t), _ in self.parts)
    self.identity = {"directions": [{"direction": f"{s}-{t}",
                                     "pairs": getattr(p, "identity", None)}
                                    for (s, t), p in self.parts],
                     "pair_temperature": temperature, "seed": seed,
                     "target_tokens": dict(languages.target_tokens),
                     **({"source_tokens": dict(languages.source_tokens)}
                        if languages.source_tokens else {})}

  def __len__(self):
    return len(self.index)

  def source_text(self, source: str, text: str) -> str:
    """A source text as the model reads it: its language's token first where the model's
    tokenizer takes one (NLLB/M2M100's source_tokens)."""
    token = self.languages.source_tokens.get(source)
    return f"{token} {text}" if token else text

  def _marked(self, d: int, pair) -> tuple[str, str]:
    source, target = self.parts[d][0]
    return (self.source_text(source, pair[0]),
            f"{self.languages.target_tokens[target]} {pair[1]}")

  def __getitem__(self, i):
    d, j = self.index[i]
    return self._marked(d, self.parts[d][1][j])

  def __getitems__(self, indices):
    return [self[i] for i in indices]


def load(config, split: str, load_pairs: Callable,
         model: Languages | None = None) -> MultilingualPairs:
  """Every direction of `config.languages` for `split` (`load_pairs(config)` reads the
  config's one pair): the training split mixed at config.pair_temperature, any other
  with every example once (temperature 1 over directions of one size). `model`: the
  init_from model's languages record (`of_model`); the data's files are read by each
  code's ISO 639 form (eng_Latn: en)."""
  if "text" in (config.dataset_name, config.get("eval_dataset_name")):
    raise ConfigError("config.languages needs a dataset holding every language (multi30k, "
                      "a tfds builder); dataset_name='text' names one pair of files")
  languages = from_config(config) if model is None else of_model(config, model)
  data_code = (lambda code: code) if model is None else language_codes.iso_form
  by_direction = {}
  for source, target in languages.pairs():
    one = config.copy_and_resolve_references()
    with one.unlocked():
      one.languages, one.source_lang, one.target_lang = "", data_code(source), data_code(target)
    by_direction[source, target] = load_pairs(one)
  temperature = config.pair_temperature if split == config.train_split else 1.0
  return MultilingualPairs(by_direction, languages, temperature, seed=config.get("seed", 0))


def eval_directions(eval_set, tokenizer) -> dict[str, tuple[list, np.ndarray, list[str]]]:
  """A multilingual evaluation set's directions: 'en-de' -> (source ids, the target
  token's ids to force, reference texts); {} for a one-pair set."""
  pairs = getattr(eval_set, "pairs", None)
  if not isinstance(pairs, MultilingualPairs):
    return {}
  out = {}
  for (source, target), part in pairs.parts:
    raw = [part[i] for i in range(len(part))]
    forced = tokenizer.target.tokenize(pairs.languages.target_tokens[target])[:-1]
    out[f"{source}-{target}"] = ([tokenizer.source.tokenize(pairs.source_text(source, s))
                                  for s, _ in raw],
                                 np.asarray(forced, np.int32), [t for _, t in raw])
  return out
