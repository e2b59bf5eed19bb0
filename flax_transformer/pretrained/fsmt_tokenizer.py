"""fairseq's WMT19 tokenization, as transformers' FSMTTokenizer does it: Moses, then BPE.

A text goes through Moses' punctuation normalisation and tokenizer (sacremoses, with the
options FSMTTokenizer passes); each Moses token is split by the BPE merges into pieces
('</w>' ends a word's last piece), each piece looked up in its side's vocabulary
(unknown pieces as '<unk>'), and EOS ends the sequence. The special tokens' strings in
the text ('<s>', '<pad>', '</s>', '<unk>') are each their own token, as transformers
splits at them first. Detokenization drops the special tokens (unknowns too), joins the
pieces into words and runs Moses' detokenizer: FSMTTokenizer.decode(ids,
skip_special_tokens=True).

FSMTTokenizer tokenizes with the source side only; the target side here (the target
language's Moses, the same merges, the target vocabulary) is how fairseq prepares
targets, which --score and --prefix need.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import sacremoses

from flax_transformer.data.tokenizer import EOS_ID, trim
from flax_transformer.pretrained import tokenizer_files

FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt")
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # FSMTTokenizer's bos, pad, sep (EOS), unk.
_SPECIAL_SPLIT = tokenizer_files.special_splitter(SPECIALS)  # As transformers' trie cuts.


def remove_non_printing_chars(text: str) -> str:
  """Drops every character of a Unicode 'C' category (Moses' remove-non-printing-char)."""
  return "".join(c for c in text if not unicodedata.category(c).startswith("C"))


def read_merges(text: str) -> dict[tuple[str, str], int]:
  """A merges file -> {pair: rank}, read as FSMTTokenizer reads it: what follows the last
  newline is dropped, a line's first two fields are its pair (a count after them is
  ignored), and a pair listed twice keeps its later rank."""
  lines = text.split("\n")[:-1]
  return {pair: rank for rank, pair in enumerate(tuple(line.split()[:2]) for line in lines)}


class BPE:
  """Splits a Moses token into pieces by merge rank, lowest first (Sennrich et al., 2016)."""

  def __init__(self, ranks: Mapping[tuple[str, str], int]):
    self.ranks = dict(ranks)
    self._cache: dict[str, list[str]] = {}

  def __call__(self, token: str) -> list[str]:
    """token -> pieces; the last one ends in '</w>'."""
    if token not in self._cache:
      self._cache[token] = self._split(token)
    return self._cache[token]

  def _split(self, token: str) -> list[str]:
    word = list(token[:-1]) + [token[-1] + "</w>"]
    while len(word) > 1:
      best = min(set(zip(word, word[1:])), key=lambda p: self.ranks.get(p, float("inf")))
      if best not in self.ranks:
        break
      merged, i = [], 0
      while i < len(word):  # Every occurrence, left to right, none overlapping.
        if i < len(word) - 1 and (word[i], word[i + 1]) == best:
          merged.append(word[i] + word[i + 1])
          i += 2
        else:
          merged.append(word[i])
          i += 1
      word = merged
    return word


class FSMTSide:
  """One side (a language and its vocabulary, piece -> id with pad 0 and EOS 1) of an FSMT
  tokenizer; the interface of `tokenizers.MarianSide`."""

  def __init__(self, lang: str, vocab: Mapping[str, int], bpe: BPE, *,
               do_lower_case: bool = False, identity: bytes = b"", clean_up: bool = False):
    self.lang, self._vocab, self._bpe = lang, dict(vocab), bpe
    self._clean_up = clean_up  # tokenizer_config.json's clean_up_tokenization_spaces.
    self._lower = do_lower_case
    self._pieces = {i: piece for piece, i in self._vocab.items()}
    self._unk = self._vocab["<unk>"]
    self._special = {self._vocab[s] for s in SPECIALS if s in self._vocab}
    self._identity = identity
    # FSMTTokenizer's Moses: unicode punctuation replaced before the normaliser.
    self._normalizer = sacremoses.MosesPunctNormalizer(lang=lang, pre_replace_unicode_punct=True)
    self._moses = sacremoses.MosesTokenizer(lang=lang)
    self._detokenizer = sacremoses.MosesDetokenizer(lang=lang)

  @property
  def vocab_size(self) -> int:
    return len(self._vocab)

  def moses_tokens(self, text: str) -> list[str]:
    """FSMTTokenizer's pipeline: punctuation normalised, non-printing characters dropped,
    then Moses' tokenizer (aggressive dash splits, special characters escaped)."""
    text = remove_non_printing_chars(self._normalizer.normalize(text))
    return self._moses.tokenize(text, aggressive_dash_splits=True, return_str=False,
                                escape=True)

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    """Ids of many texts (no EOS)."""
    del num_threads  # Moses runs in Python.
    return [self._encode(text) for text in texts]

  def _encode(self, text: str) -> list[int]:
    ids = []
    for chunk in _SPECIAL_SPLIT.split(text):
      if chunk in SPECIALS:
        ids.append(self._vocab.get(chunk, self._unk))
      elif chunk:
        for token in self.moses_tokens(chunk.lower() if self._lower else chunk):
          ids.extend(self._vocab.get(piece, self._unk) for piece in self._bpe(token))
    return ids

  def tokenize(self, text: str) -> np.ndarray:
    """str -> int32 [len + 1], ending in EOS."""
    return np.asarray(self._encode(text) + [EOS_ID], np.int32)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self._pieces.get(int(i), "<unk>") for i in ids]

  def detokenize(self, ids: Iterable[int]) -> str:
    """ids -> text; stops at the first EOS, drops the special tokens."""
    pieces = self.pieces(trim(ids, self._special))
    words = "".join(p.replace(" ", "").replace("</w>", " ") for p in pieces).split()
    text = self._detokenizer.detokenize(words)
    return tokenizer_files.clean_up_tokenization(text) if self._clean_up else text

  def model_bytes(self) -> bytes:
    return self._identity


def sides(directory, spec: dict, check_vocabulary: Callable[[object, dict], dict]
          ) -> tuple[FSMTSide, FSMTSide]:
  """(source, target) from an imported workdir's FILES in `directory` (the vocabularies in
  the project's ids, each checked by `check_vocabulary(path, table)`); `spec` is run.json's
  tokenizer entry: {"kind": "fsmt", "langs": [source, target], "do_lower_case": bool}."""
  blobs = tokenizer_files.read_files(directory, FILES)
  bpe = BPE(read_merges(blobs["merges.txt"].decode("utf-8")))
  lower = bool(spec.get("do_lower_case", False))
  out = []
  for name, lang in zip(FILES[:2], spec["langs"]):
    vocab = check_vocabulary(directory / name,
                             tokenizer_files.parse_json(directory / name, blobs[name]))
    identity = hashlib.sha256(blobs[name] + blobs["merges.txt"] + f"{lang} {lower}".encode())
    out.append(FSMTSide(lang, vocab, bpe, do_lower_case=lower,
                        identity=identity.hexdigest().encode(),
                        clean_up=bool(spec.get("clean_up_tokenization_spaces", False))))
  return out[0], out[1]
