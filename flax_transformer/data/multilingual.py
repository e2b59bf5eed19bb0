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

from flax_transformer.errors import ConfigError
from flax_transformer.languages import Languages, from_config


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
                     "target_tokens": dict(languages.target_tokens)}

  def __len__(self):
    return len(self.index)

  def _marked(self, d: int, pair) -> tuple[str, str]:
    target = self.parts[d][0][1]
    return pair[0], f"{self.languages.target_tokens[target]} {pair[1]}"

  def __getitem__(self, i):
    d, j = self.index[i]
    return self._marked(d, self.parts[d][1][j])

  def __getitems__(self, indices):
    return [self[i] for i in indices]


def load(config, split: str, load_pairs: Callable) -> MultilingualPairs:
  """Every direction of `config.languages` for `split` (`load_pairs(config)` reads the
  config's one pair): the training split mixed at config.pair_temperature, any other
  with every example once (temperature 1 over directions of one size)."""
  if "text" in (config.dataset_name, config.get("eval_dataset_name")):
    raise ConfigError("config.languages needs a dataset holding every language (multi30k, "
                      "a tfds builder); dataset_name='text' names one pair of files")
  languages = from_config(config)
  by_direction = {}
  for source, target in languages.pairs():
    one = config.copy_and_resolve_references()
    with one.unlocked():
      one.languages, one.source_lang, one.target_lang = "", source, target
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
    out[f"{source}-{target}"] = ([tokenizer.source.tokenize(s) for s, _ in raw],
                                 np.asarray(forced, np.int32), [t for _, t in raw])
  return out
