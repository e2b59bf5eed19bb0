"""A deterministic WMT14-sized EN-DE corpus made of Multi30k, for input-path benchmarks.

What it is: each pair joins consecutive-in-a-random-order Multi30k EN-DE training
pairs (both sides, so the two stay translations of each other) until the English
side reaches a length drawn from a log-normal (MEDIAN_WORDS, SIGMA; capped at
MAX_WORDS), chosen so that, whole sentences joined, the English side averages about
WMT14 EN-DE's length with a tail past 100 words (the measured statistics are in
bench/wmt_scale.py's `generate` record). Perturbed for a vocabulary nearer news text than Multi30k's 10k/18k word
types: 3% of words become a number (years, counts, decimals) on both sides, and
2% of German words join the next into a compound. Not a translation corpus anyone
should train on: its purpose is token counts, lengths and vocabulary size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

MEDIAN_WORDS, SIGMA, MAX_WORDS = 14.0, 0.75, 400
NUMBER_RATE, COMPOUND_RATE = 0.03, 0.02
# The real archives' shares of WMT14 EN-DE's 4.5M training pairs (tfds subsets).
SUBSET_SHARES = {"training-parallel-europarl-v7.tgz": 1_920_209,
                 "training-parallel-commoncrawl.tgz": 2_399_123,
                 "training-parallel-nc-v9.tgz": 201_288}


def _numbers(rng: np.random.Generator, n: int) -> list[str]:
  kinds, values = rng.integers(0, 3, n), rng.integers(0, 100_000, n)
  return [str(1900 + v % 130) if k == 0 else f"{v:,}" if k == 1 else f"{v % 100}.{v % 10}"
          for k, v in zip(kinds, values)]


def pairs(multi30k_dir: str | Path, count: int, seed: int = 0,
          chunk: int = 50_000) -> Iterator[tuple[str, str]]:
  """`count` (de, en) pairs, the same for the same arguments."""
  from flax_transformer.data import sources

  en = [s.split() for s in sources.read_lines(Path(multi30k_dir) / "train.en.gz")]
  de = [s.split() for s in sources.read_lines(Path(multi30k_dir) / "train.de.gz")]
  rng = np.random.default_rng(seed)
  made = 0
  while made < count:
    n = min(chunk, count - made)
    lengths = np.minimum(MAX_WORDS, np.maximum(
        1, rng.lognormal(np.log(MEDIAN_WORDS), SIGMA, n).astype(np.int64)))
    starts = rng.integers(0, len(en), n)
    for length, start in zip(lengths, starts):
      e, d, i = [], [], int(start)
      while len(e) < length:
        e += en[i]
        d += de[i]
        i = (i * 7919 + 1) % len(en)  # A fixed walk through the corpus.
      # Numbers replace words at the same relative place on both sides.
      marks = rng.random(len(e)) < NUMBER_RATE
      if marks.any():
        values = iter(_numbers(rng, int(marks.sum())))
        for j in np.flatnonzero(marks):
          v = next(values)
          e[j] = v
          d[min(len(d) - 1, j * len(d) // len(e))] = v
      joins = np.flatnonzero(rng.random(len(d) - 1) < COMPOUND_RATE) if len(d) > 1 else []
      for j in reversed(joins):
        d[j:j + 2] = [d[j] + d[j + 1].lower()]
      yield " ".join(d), " ".join(e)
    made += n


def write_subset_texts(multi30k_dir, count: int, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
  """{archive: pairs}, split over the three EN-DE subsets in WMT14's proportions."""
  total = sum(SUBSET_SHARES.values())
  stream = pairs(multi30k_dir, count, seed)
  out, given = {}, 0
  for k, (archive, share) in enumerate(SUBSET_SHARES.items()):
    n = count - given if k == len(SUBSET_SHARES) - 1 else round(count * share / total)
    out[archive] = [next(stream) for _ in range(n)]
    given += n
  return out
