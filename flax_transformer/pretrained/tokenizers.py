"""Tokenizers of imported workdirs: a source and a target side, built from the files under
`<workdir>/tokenizer/` as run.json's "tokenizer" entry ({"kind": ..., ...}) says.

Every side tokenizes with the project's ids (pad 0, EOS 1 appended; the importer permuted
the vocabulary files to them) and has the interface translation uses of a trained
workdir's `data.tokenizer.Tokenizer` (which is both sides of itself): `tokenize(text) ->
int32 [len + 1]`, `detokenize(ids)`, `pieces(ids)`, `encode_batch(texts)`, `vocab_size`,
`model_bytes()` (what identifies it). A kind registers its loader in `KINDS`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import sentencepiece as spm

from flax_transformer.data import tokenizer_kinds
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, trim
from flax_transformer.errors import DataError
from flax_transformer.pretrained import tokenizer_files
from flax_transformer.pretrained.tokenizer_files import (  # noqa: F401 (re-exported)
    CLEAN_UP, PairTokenizer, check_vocabulary, clean_up_tokenization, special_splitter,
    vocabulary_ids)

SPIECE_UNDERLINE = "\u2581"


class MarianSide:
  """One side of MarianTokenizer: the text cut at the special tokens' strings ('</s>',
  '<unk>', '<pad>': each its own id), the rest as sentencepiece pieces, each looked up in a
  vocabulary (piece -> id, vocab.json's), unknown pieces as '<unk>', EOS appended. A
  target-language tag such as '>>fra<<' that starts a chunk is one token, as
  MarianTokenizer keeps it. Outputs are written as MarianTokenizer.decode(ids,
  skip_special_tokens=True) writes them: pad, EOS and unknown tokens dropped, the pieces
  joined by the `decoder` model, then `clean_up_tokenization` where `clean_up`.
  """

  SPECIALS = ("</s>", "<unk>", "<pad>")

  def __init__(self, encoder: spm.SentencePieceProcessor, decoder: spm.SentencePieceProcessor,
               vocab: dict[str, int], *, identity: bytes, clean_up: bool = False):
    self._encoder, self._decoder, self._vocab = encoder, decoder, vocab
    self._pieces = [""] * len(vocab)
    for piece, i in vocab.items():
      self._pieces[i] = piece
    self._unk = vocab["<unk>"]
    self._special = {PAD_ID, EOS_ID, self._unk}
    self._splitter = special_splitter(self.SPECIALS)
    self._identity, self._clean_up = identity, clean_up

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def _split(self, text: str) -> list[str]:
    pieces = []
    for chunk in self._splitter.split(text):
      if chunk in self.SPECIALS:
        pieces.append(chunk)
      elif chunk:
        if chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
          pieces.append(chunk[:end + 2])
          chunk = chunk[end + 2:]
        pieces += self._encoder.encode(chunk, out_type=str)
    return pieces

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    """Ids of many texts (no EOS)."""
    return [[self._vocab.get(p, self._unk) for p in self._split(t)] for t in texts]

  def tokenize(self, text: str) -> np.ndarray:
    """str -> int32 [len + 1], ending in EOS."""
    return np.asarray(self.encode_batch([text])[0] + [EOS_ID], np.int32)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self._pieces[int(i)] for i in ids]

  def detokenize(self, ids: Iterable[int]) -> str:
    """ids -> text; stops at the first EOS."""
    kept = self.pieces(trim(ids, self._special))
    text = self._decoder.decode_pieces(kept).replace(SPIECE_UNDERLINE, " ").strip()
    return clean_up_tokenization(text) if self._clean_up else text

  def model_bytes(self) -> bytes:
    return self._identity


MARIAN_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json")


def load_marian(directory, spec: dict) -> PairTokenizer:
  """Marian's files in `directory`: source.spm, target.spm, vocab.json and, with
  spec["separate_vocabularies"], target_vocab.json (all with the project's ids)."""
  separate = bool(spec.get("separate_vocabularies"))
  clean_up = bool(spec.get("clean_up_tokenization_spaces", False))
  models, blobs = {}, {}
  for name in ("source.spm", "target.spm"):
    blobs.update(tokenizer_files.read_files(directory, [name]))
    models[name] = spm.SentencePieceProcessor(model_proto=blobs[name])
  vocabs = {}
  for name in ("vocab.json", "target_vocab.json") if separate else ("vocab.json",):
    blobs.update(tokenizer_files.read_files(directory, [name]))
    vocabs[name] = check_vocabulary(directory / name,
                                    tokenizer_files.parse_json(directory / name, blobs[name]))

  def identity(*names):
    return hashlib.sha256(b"".join(blobs[n] for n in names)).hexdigest().encode()

  source = MarianSide(models["source.spm"], models["source.spm"], vocabs["vocab.json"],
                      identity=identity("source.spm", "vocab.json"), clean_up=clean_up)
  if not separate:  # transformers decodes a shared vocabulary's outputs with source.spm.
    target = MarianSide(models["target.spm"], models["source.spm"], vocabs["vocab.json"],
                        identity=identity("target.spm", "vocab.json"), clean_up=clean_up)
  else:
    target = MarianSide(models["target.spm"], models["target.spm"], vocabs["target_vocab.json"],
                        identity=identity("target.spm", "target_vocab.json"),
                        clean_up=clean_up)
  return PairTokenizer(source, target, directory)


def load_fsmt(directory, spec: dict) -> PairTokenizer:
  """FSMT's files in `directory` (fsmt_tokenizer.FILES, the vocabularies in the project's
  ids); spec: {"kind": "fsmt", "langs": [source, target], "do_lower_case": bool}."""
  from flax_transformer.pretrained import fsmt_tokenizer
  return PairTokenizer(*fsmt_tokenizer.sides(directory, spec, check_vocabulary), directory)


def load_m2m100(directory, spec: dict) -> PairTokenizer:
  """M2M100Tokenizer's or NllbTokenizer's files (m2m100_tokenizer.FILES, the project's ids)."""
  from flax_transformer.pretrained import m2m100_tokenizer
  return m2m100_tokenizer.load(directory, spec)


KINDS: dict[str, Callable[[Any, dict], PairTokenizer]] = {"marian": load_marian,
                                                          "fsmt": load_fsmt,
                                                          "m2m100": load_m2m100}


def load(directory, spec: dict) -> PairTokenizer:
  """The tokenizer run.json's "tokenizer" entry `spec` describes, from `directory` (a
  local or bucket path)."""
  kind = spec.get("kind") if isinstance(spec, dict) else None
  if kind not in KINDS:
    raise DataError(f"run.json: tokenizer kind {kind!r} is not one of {sorted(KINDS)}")
  try:
    tokenizer = KINDS[kind](directory, spec)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:  # A kind's file not parsed above.
    raise DataError(f"{directory}: a tokenizer file is not JSON ({e})") from None
  tokenizer.spec = dict(spec)  # What an export records of it (export.write_vocabulary).
  return tokenizer


for _kind in KINDS:  # workdir.read_run reads an imported workdir's tokenizer through these.
  tokenizer_kinds.register(_kind, load)
