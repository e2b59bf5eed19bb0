"""What every imported tokenizer kind shares: its files read from an imported workdir
(`read_files`), its vocabulary checked, the pair of sides it makes (`PairTokenizer`),
and transformers' clean-up of decoded text. Below the kinds' own modules (tokenizers.py's
Marian, fsmt_tokenizer.py, m2m100_tokenizer.py), which all import it."""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

import numpy as np

from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.errors import DataError


def read_files(directory, names: Iterable[str]) -> dict[str, bytes]:
  """name -> the bytes of each of `names` under `directory` (an imported workdir's
  tokenizer/, local or in a bucket); FileNotFoundError naming the first missing."""
  blobs = {}
  for name in names:
    path = directory / name
    if not path.is_file():
      raise FileNotFoundError(f"tokenizer file not found: {path}")
    blobs[name] = path.read_bytes()
  return blobs


def parse_json(path, blob: bytes) -> Any:
  """The JSON in `blob` (the file `path`'s bytes), or a DataError naming the file: a
  workdir's tokenizer/ edited by hand, or cut short by a full disk."""
  try:
    return json.loads(blob)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: not JSON ({e})") from None


class PairTokenizer:
  """A source and a target side (`source`, `target`); as a whole it tokenizes sources and
  detokenizes targets, so code written for one shared vocabulary reads as before."""

  def __init__(self, source, target, path):
    self.source, self.target, self.path = source, target, path

  @property
  def vocab_size(self) -> int:
    """The target vocabulary's size (the model's `vocab_size`, its logits)."""
    return self.target.vocab_size

  def tokenize(self, text: str) -> np.ndarray:
    return self.source.tokenize(text)

  def detokenize(self, ids: Iterable[int]) -> str:
    return self.target.detokenize(ids)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return self.target.pieces(ids)

  def model_bytes(self) -> bytes:
    return self.source.model_bytes() + self.target.model_bytes()

  def same_vocabulary(self, other) -> bool:
    """Whether both sides mean the same pieces by the same ids (an ensemble's members)."""
    return all(hasattr(other, side) and getattr(self, side).model_bytes()
               == getattr(other, side).model_bytes() for side in ("source", "target"))


def clean_up_tokenization(text: str) -> str:
  """transformers' `clean_up_tokenization`, which decode applies where a tokenizer's
  clean_up_tokenization_spaces is true: spaces before English punctuation and
  contractions dropped."""
  for before, after in CLEAN_UP:
    text = text.replace(before, after)
  return text


CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def special_splitter(specials: Iterable[str]) -> re.Pattern:
  """A pattern whose split() cuts a text at the special tokens' strings, each kept as its
  own chunk, as transformers' added-token trie does (the longest at the leftmost place)."""
  return re.compile("(" + "|".join(map(re.escape, sorted(specials, key=len, reverse=True)))
                    + ")")


def vocabulary_ids(path, vocab, specials) -> dict[str, int]:
  """`vocab` if it is a piece -> id table with ids 0..n-1, each once, and every one of
  `specials`; else a DataError naming `path`'s problem."""
  if not isinstance(vocab, dict) or not all(
      isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
    raise DataError(f"{path}: not a JSON object of piece -> integer id")
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise DataError(f"{path}: ids are not 0..{len(vocab) - 1}, each once")
  for piece in specials:
    if piece not in vocab:
      raise DataError(f"{path}: no {piece!r} piece")
  return vocab


def check_vocabulary(path, vocab) -> dict[str, int]:
  """A piece -> id table with ids 0..n-1, '<pad>' 0, '</s>' 1 and an '<unk>' (an imported
  workdir's), or a DataError naming `path`'s problem."""
  vocabulary_ids(path, vocab, ("<pad>", "</s>", "<unk>"))
  for piece, wanted in (("<pad>", PAD_ID), ("</s>", EOS_ID)):
    if vocab[piece] != wanted:
      raise DataError(f"{path}: {piece!r} has id {vocab[piece]}, the project needs "
                      f"{wanted} (import_model.py writes it so)")
  return vocab
