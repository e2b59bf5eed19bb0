"""M2M100Tokenizer's and NllbTokenizer's work without transformers: sentencepiece pieces
looked up in one full vocabulary (piece -> id), the source's language token placed as the
tokenizer places it, EOS appended.

Both tokenizers are fairseq dictionaries over a BPE sentencepiece model: '<s>' 0, '<pad>' 1,
'</s>' 2, '<unk>' 3, then the pieces, then the language tokens (and NLLB's '<mask>').
- M2M100Tokenizer: vocab.json holds the specials and pieces; its language tokens ('__en__')
  follow at len(vocab.json) + i in the order of its `language_codes` list ('m2m100': 100
  codes, 'wmt21': 8), then `num_madeup_words` 'madeupwordNNNN' tokens. The source is
  [__src__] pieces [EOS].
- NllbTokenizer: piece i of sentencepiece.bpe.model is id i + 1 (fairseq's offset); the
  language codes ('eng_Latn') and '<mask>' are added tokens whose ids tokenizer.json names
  (transformers 5's; transformers 4's slow tokenizer: the codes at len(spm) + 1 + i, then
  '<mask>'). The source is [eng_Latn] pieces [EOS], or with legacy_behaviour=true pieces
  [EOS] [eng_Latn].
A model may have more rows than the tokenizer has ids (NLLB-200: 256,206 rows, 256,204
ids): they become '<unused_N>' pieces, never produced by tokenizing, dropped when written.

The import writes the full table in the project's ids as vocab.json beside the
sentencepiece model; at run time a text that starts with a language token ('eng_Latn
A man...', as flax_transformer.translation.directions puts a source's token) is that
language's source, any other the tokenizer's default (src_lang of tokenizer_config.json).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from flax_transformer.data.tokenizer import EOS_ID, trim
from flax_transformer.errors import DataError
from flax_transformer.pretrained.vocab_padding import fill_rows

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's dictionary: ids 0-3.
SPIECE_UNDERLINE = "\u2581"
FILES = ("sentencepiece.bpe.model", "vocab.json")
# M2M100Tokenizer's `language_codes` lists (fairseq's), in id order.
M2M100_CODES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga "
        "gd gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt "
        "lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss "
        "su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}


def _spm(data: bytes, where: Path) -> spm.SentencePieceProcessor:
  try:
    return spm.SentencePieceProcessor(model_proto=data)
  except RuntimeError as e:
    raise DataError(f"{where}: not a sentencepiece model ({e})") from None


def m2m100_vocabulary(vocab: dict[str, int], codes: Sequence[str], madeup: int, rows: int,
                      where: Path) -> tuple[dict[str, int], dict[str, str]]:
  """(piece -> id over the model's `rows`, language code -> its token) of M2M100Tokenizer:
  vocab.json's `vocab`, then '__xx__' for each of `codes`, then `madeup` made-up words."""
  full = dict(vocab)
  tokens = {code: f"__{code}__" for code in codes}
  for token in list(tokens.values()) + [f"madeupword{i:04d}" for i in range(madeup)]:
    full.setdefault(token, len(full))
  return fill_rows(full, rows, where), tokens


def nllb_vocabulary(model: spm.SentencePieceProcessor, added: dict[int, str], rows: int,
                    where: Path) -> dict[str, int]:
  """piece -> id over the model's `rows` of NllbTokenizer: the specials, sentencepiece's
  pieces at their id + 1, the `added` tokens (id -> content: codes, '<mask>')."""
  full = {piece: i for i, piece in enumerate(SPECIALS)}
  for i in range(model.get_piece_size()):
    if not (model.is_control(i) or model.is_unknown(i)):
      full[model.id_to_piece(i)] = i + 1
  for i, content in sorted(added.items()):
    if full.get(content, i) != i:
      raise DataError(f"{where}: added token {content!r} has id {i}, the vocabulary "
                      f"{full[content]}")
    full[content] = i
  return fill_rows(full, rows, where)


class M2M100Side:
  """One side of M2M100Tokenizer / NllbTokenizer in the project's ids (module docstring).
  language: whether this side adds the source's language token (the source side);
  language_first: before the pieces (else after EOS, NLLB's legacy_behaviour)."""

  def __init__(self, model: spm.SentencePieceProcessor, vocab: dict[str, int],
               language_tokens: Sequence[str], *, language: bool, language_first: bool,
               default_language: str | None, identity: bytes, trailing_space: bool = False):
    self._model, self._vocab, self._identity = model, vocab, identity
    self._pieces = [""] * len(vocab)
    for piece, i in vocab.items():
      self._pieces[i] = piece
    self._unk = vocab["<unk>"]
    self._languages = {vocab[t] for t in language_tokens}
    specials = set(SPECIALS) | set(language_tokens) | ({"<mask>"} & set(vocab))
    self._special_ids = {vocab[s] for s in specials} | {
        i for i, p in enumerate(self._pieces) if p.startswith("<unused_")
        or p.startswith("madeupword")}
    from flax_transformer.pretrained.tokenizer_files import special_splitter
    self.clean_up = False  # load() sets it from run.json's spec.
    self._splitter = special_splitter(specials)
    self._specials = specials
    self._language, self._first = language, language_first
    self._default = vocab[default_language] if default_language in vocab else None
    # NllbTokenizer (tokenizers' Metaspace, spaces kept): a chunk's trailing space is a
    # piece of its own, '▁', where sentencepiece drops it; M2M100Tokenizer's drops it.
    self._trailing_space = vocab.get(SPIECE_UNDERLINE) if trailing_space else None

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def piece_id(self, piece: str) -> int | None:
    return self._vocab.get(piece)

  def _ids(self, text: str) -> list[int]:
    ids = []
    chunks = self._splitter.split(text)
    for i, chunk in enumerate(chunks):
      # '<mask>' takes the space before it (lstrip), as NllbTokenizer's added token does.
      space = (self._trailing_space is not None and chunk[-1:].isspace()
               and (i + 1 >= len(chunks) or chunks[i + 1] != "<mask>"))
      if chunk in self._specials:
        ids.append(self._vocab[chunk])
        continue
      if chunk.strip():
        ids += [self._vocab.get(p, self._unk) for p in self._model.encode(chunk, out_type=str)]
      if space:
        ids.append(self._trailing_space)
    return ids

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    """Ids of many texts, without EOS (and without a source's language token)."""
    return [self._ids(t) for t in texts]

  def tokenize(self, text: str) -> np.ndarray:
    """str -> int32 ids with EOS; the source side adds its language token (a leading one
    in `text`, else the default) before the pieces, or after EOS (legacy)."""
    ids = self._ids(text)
    if not self._language:
      return np.asarray(ids + [EOS_ID], np.int32)
    language = ids.pop(0) if ids and ids[0] in self._languages else self._default
    tag = [] if language is None else [language]
    return np.asarray(tag + ids + [EOS_ID] if self._first else ids + [EOS_ID] + tag, np.int32)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self._pieces[int(i)] for i in ids]

  def detokenize(self, ids: Iterable[int]) -> str:
    """ids -> text up to the first EOS, special tokens (languages included) dropped."""
    kept = self.pieces(trim(ids, self._special_ids))
    text = self._model.decode_pieces(kept).replace(SPIECE_UNDERLINE, " ").strip()
    if not self.clean_up:
      return text
    from flax_transformer.pretrained.tokenizer_files import clean_up_tokenization
    return clean_up_tokenization(text)

  def model_bytes(self) -> bytes:
    return self._identity


def load(directory, spec: dict):
  """An imported M2M100/NLLB workdir's tokenizer (FILES under `directory`; spec:
  {"kind": "m2m100", "language_tokens": [...], "source_language_first": bool,
  "default_source_token": piece or None})."""
  from flax_transformer.pretrained.tokenizer_files import (PairTokenizer, check_vocabulary,
                                                           read_files)
  blobs = read_files(directory, FILES)
  model = _spm(blobs[FILES[0]], directory / FILES[0])
  vocab = check_vocabulary(directory / FILES[1], json.loads(blobs[FILES[1]]))
  identity = hashlib.sha256(blobs[FILES[0]] + blobs[FILES[1]]).hexdigest().encode()
  tokens = [t for t in spec.get("language_tokens", []) if t in vocab]
  common = dict(language_first=bool(spec.get("source_language_first", True)),
                default_language=spec.get("default_source_token"), identity=identity,
                trailing_space=spec.get("tokenizer_class", "").startswith("Nllb"))
  source = M2M100Side(model, vocab, tokens, language=True, **common)
  target = M2M100Side(model, vocab, tokens, language=False, **common)
  # tokenizer_config.json's clean_up_tokenization_spaces (4.3x wrote true): applied on
  # decode as transformers applies it.
  source.clean_up = target.clean_up = bool(spec.get("clean_up_tokenization_spaces", False))
  return PairTokenizer(source, target, directory)


def read_spm(folder: Path) -> tuple[bytes, spm.SentencePieceProcessor]:
  path = folder / FILES[0]
  if not path.is_file():
    raise DataError(f"{path} not found (the tokenizer's sentencepiece model)")
  data = path.read_bytes()
  return data, _spm(data, path)


def dumps(vocab: dict[str, int]) -> bytes:
  return json.dumps(vocab, ensure_ascii=False, indent=0).encode()
