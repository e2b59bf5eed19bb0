"""Each sentence's direction (source and target language), as the model reads it: the one
place that turns a workdir's languages record (flax_transformer.languages) into inputs.

target_by "source_tag": the target's tag is put before the source text (OPUS-MT's '>>fra<<
text', tokenized by its tokenizer as one token); "decoder_prefix": the target's token is
forced as the decoder's first output (its ids as the target side tokenizes its text: a
sentencepiece user-defined symbol is '▁' and itself, as training's targets start), before
any prefix the caller forces, and cut from the hypotheses before they are written;
"none": nothing (one target).
The target is per row: one compiled search serves a batch of mixed targets (forced ids are
data, search.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from flax_transformer.errors import DataError
from flax_transformer.languages import Languages

Codes = str | Sequence[str | None] | None  # One code for every row, or one per row.


def per_row(codes: Codes, count: int, what: str) -> list[str | None]:
  """`codes` as one entry per row (a str or None: the same for every row)."""
  if codes is None or isinstance(codes, str):
    return [codes] * count
  codes = list(codes)
  if len(codes) != count:
    raise DataError(f"{len(codes)} {what} languages for {count} sentences")
  return codes


class Directions:
  """A model's languages and tokenizer: each row's inputs for its (source, target)."""

  def __init__(self, languages: Languages, tokenizer):
    self.languages = languages
    self._target_ids: dict[str, np.ndarray] = {}
    if languages.target_by == "decoder_prefix":
      for code in languages.targets:
        self._target_ids[code] = forced_ids(tokenizer.target, languages.target_tokens[code],
                                            code)
    self._token_ids = token_ids(self._target_ids.values())

  def resolve(self, count: int, source_lang: Codes = None, target_lang: Codes = None
              ) -> list[tuple[str | None, str | None]]:
    """Each row's (source, target), checked: a pair the model does not know is an
    UnknownLanguageError naming those it does (a code left None: the model's only one)."""
    checked = {}
    rows = []
    for pair in zip(per_row(source_lang, count, "source"), per_row(target_lang, count, "target")):
      if pair not in checked:
        checked[pair] = self.languages.check_pair(*pair)
      rows.append(checked[pair])
    return rows

  def source_texts(self, sentences: Sequence[str], rows) -> list[str]:
    """The texts the tokenizer reads: the source's token first where the record has
    source_tokens (NLLB/M2M100's tokenizer takes a leading one as the source language),
    then the target's tag where target_by is source_tag (OPUS-MT's '>>fra<<')."""
    languages = self.languages
    tagged = languages.target_by == "source_tag"
    texts = []
    for s, (source, target) in zip(sentences, rows):
      if tagged and target is not None:
        s = f"{languages.target_tokens[target]} {s}"
      if source is not None and source in languages.source_tokens:
        s = f"{languages.source_tokens[source]} {s}"
      texts.append(s)
    return texts

  def added_tokens(self, tokenize) -> int:
    """The most tokens `source_texts` adds to a sentence (a target's tag, a source's
    token beyond the one the tokenizer puts anyway), as `tokenize` (the source side's)
    counts them: what a source's length holds beyond its own text's."""
    def most(pieces) -> int:
      return max((len(tokenize(f"{piece} a")) - len(tokenize("a")) for piece in pieces),
                 default=0)

    languages = self.languages
    tags = languages.target_tokens.values() if languages.target_by == "source_tag" else ()
    return most(tags) + most(languages.source_tokens.values())

  @property
  def forces_target(self) -> bool:
    return bool(self._target_ids)

  def forced(self, rows, prefixes: Sequence[np.ndarray] | None) -> list[np.ndarray] | None:
    """Each row's forced target ids: its target token's (decoder_prefix), then its prefix."""
    if not self._target_ids:
      return None if prefixes is None else list(prefixes)
    prefixes = prefixes if prefixes is not None else [np.zeros(0, np.int32)] * len(rows)
    return [np.concatenate([self._target_ids[target], np.asarray(prefix, np.int32)])
            for (_, target), prefix in zip(rows, prefixes)]

  def written(self, ids: Sequence[int], target: str | None) -> list[int]:
    """A hypothesis' ids as written: without its forced target token's (`cut`)."""
    if not self._target_ids:
      return list(ids)
    return cut(ids, len(self._target_ids[target]), self._token_ids)


def forced_ids(tokenizer, token: str, code: str) -> np.ndarray:
  """The ids a decoder_prefix target's token is forced as: its tokenization by the target
  side (`tokenizer`), as training's targets start (data.multilingual), which must be the
  token as one piece of the vocabulary, after nothing but the space marker a sentencepiece
  user-defined symbol takes ('▁'): a token split into pieces would have its last piece
  taken for the token and cut from every output (`cut`). A DataError names it otherwise."""
  ids = tokenizer.tokenize(token)[:-1]
  pieces = tokenizer.pieces(ids)
  if not pieces or pieces[-1] != token or any(p.strip("▁ ") for p in pieces[:-1]):
    became = ", ".join(map(repr, pieces)) or "nothing"
    raise DataError(f"run.json: the languages record's target token {token!r} ({code}) is "
                    f"not one piece of the target vocabulary: it tokenizes to {became}")
  return np.asarray(ids, np.int32)


def token_ids(forced: Iterable[Sequence[int]]) -> dict[int, tuple[int, ...]]:
  """The id of each target's token ('<2de>': the last of its forced ids) -> the ids its
  tokenization puts before it ('▁'), for `cut`."""
  return {int(ids[-1]): tuple(int(i) for i in ids[:-1]) for ids in forced}


def cut(ids: Sequence[int], forced: int, tokens: Mapping[int, tuple[int, ...]]) -> list[int]:
  """A decoder_prefix hypothesis' ids as written: its first `forced` (the target token's)
  cut, and a target token the model writes again after them dropped, with the ids of its
  own tokenization before it ('▁'; `tokens`: `token_ids`), as transformers'
  skip_special_tokens drops NLLB's language codes: a weakly trained model writes
  '<2fr> Un chien'."""
  out: list[int] = []
  for i in map(int, list(ids)[forced:]):
    if i not in tokens:
      out.append(i)
    elif (before := list(tokens[i])) and out[-len(before):] == before:
      del out[-len(before):]
  return out
