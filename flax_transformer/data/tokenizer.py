"""One sentencepiece vocabulary shared by source and target (paper section 5.1).

Ids: 0 padding, 1 end of sequence (appended to every sequence), 2 unknown.
Normalisation is 'identity' and extra whitespace is collapsed, so
`detokenize(tokenize(x)) == " ".join(x.split())` for text the vocabulary covers.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Container, Iterable, Sequence

import numpy as np
import sentencepiece as spm

from flax_transformer import storage

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# sentencepiece's sampling generator is process-global: seeding and sampling must not
# interleave between threads, or a seed would not determine its segmentation.
_SAMPLING_LOCK = threading.Lock()


class Tokenizer:
  """Text <-> int32 ids with EOS appended; wraps a sentencepiece model file."""

  def __init__(self, model_path: str | os.PathLike):
    path = storage.as_path(model_path)
    if not path.is_file():
      raise FileNotFoundError(f"vocabulary file not found: {path}")
    # sentencepiece parses a protobuf: no pickle, no code execution. Read as bytes:
    # the file may be in a bucket.
    self._model = path.read_bytes()
    self._sp = spm.SentencePieceProcessor(model_proto=self._model)
    if self._sp.pad_id() != PAD_ID or self._sp.eos_id() != EOS_ID:
      raise ValueError(f"{path}: vocabulary must use pad id {PAD_ID} and eos id {EOS_ID}, got "
                       f"{self._sp.pad_id()} and {self._sp.eos_id()}")
    self.path = path

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def source(self) -> "Tokenizer":
    """The side that tokenizes sources: this vocabulary, shared by both sides (an
    imported model's tokenizer has two: `pretrained.tokenizers`)."""
    return self

  target = source  # The side of targets: tokenizes prefixes and references, detokenizes.

  def tokenize(self, text: str) -> np.ndarray:
    """str -> int32 [len + 1], ending in EOS."""
    return np.asarray(self._sp.encode(text) + [EOS_ID], np.int32)

  def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
    """Ids of many texts at once (no EOS), on sentencepiece's own threads."""
    return self._sp.encode(list(texts), num_threads=num_threads)

  def model_bytes(self) -> bytes:
    """The sentencepiece model as serialized (identifies the vocabulary)."""
    return self._model

  def tokenize_sampled(self, texts: Sequence[str], *, alpha: float,
                       seed: int) -> list[np.ndarray]:
    """Subword regularisation: one sampled segmentation per text, EOS appended.

    BPE vocabularies drop each merge with probability `alpha` (BPE-dropout,
    Provilkov et al., 2020); unigram ones sample from the lattice with
    smoothing `alpha` (Kudo, 2018). The same `seed` gives the same segmentations.
    """
    with _SAMPLING_LOCK:
      spm.set_random_generator_seed(seed)
      # One text per call: a list would be split over sentencepiece's worker threads,
      # whose generators the seed does not reach.
      ids = [self._sp.encode(text, enable_sampling=True, alpha=alpha, nbest_size=-1)
             for text in texts]
    return [np.asarray(i + [EOS_ID], np.int32) for i in ids]

  def same_vocabulary(self, other: "Tokenizer") -> bool:
    """Whether every id means the same piece in both (so models can share ids)."""
    return (self.vocab_size == other.vocab_size and
            all(self._sp.id_to_piece(i) == other._sp.id_to_piece(i)
                for i in range(self.vocab_size)))

  def pieces(self, ids: Iterable[int]) -> list[str]:
    """The vocabulary piece of each id (for plots, debugging, CTranslate2's tokens)."""
    return [self._sp.id_to_piece(int(i)) for i in ids]

  def detokenize(self, ids: Iterable[int]) -> str:
    """ids -> text; stops at the first EOS, skips padding."""
    return self._sp.decode(trim(ids))


def trim(ids: Iterable[int], drop: Container[int] = (PAD_ID,)) -> list[int]:
  """Ids up to (not including) the first EOS, those in `drop` (padding) removed."""
  out = []
  for i in np.asarray(ids).tolist():
    if i == EOS_ID:
      break
    if i not in drop:
      out.append(i)
  return out


def train_tokenizer(sentences: Iterable[str], output_path: str | os.PathLike, *,
                    vocab_size: int, model_type: str = "bpe",
                    character_coverage: float = 1.0,
                    user_defined_symbols: Sequence[str] = ()) -> Tokenizer:
  """Trains a sentencepiece model on `sentences`; writes it atomically to `output_path`.
  user_defined_symbols: pieces always kept whole (a multilingual run's target tokens)."""
  output_path = storage.as_path(output_path)
  output_path.parent.mkdir(parents=True, exist_ok=True)
  start = time.time()
  count = 0

  def counted():
    nonlocal count
    for s in sentences:
      count += 1
      if count % 200_000 == 0:
        logging.info("vocabulary: read %d sentences (%.0f s)", count, time.time() - start)
      yield s

  logging.info("Training a %d-piece %s vocabulary -> %s", vocab_size, model_type, output_path)
  with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=counted(), model_prefix=prefix, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        normalization_rule_name="identity", remove_extra_whitespaces=True,
        input_sentence_size=0, shuffle_input_sentence=False,
        user_defined_symbols=list(user_defined_symbols),
        minloglevel=2, num_threads=os.cpu_count() or 1)
    # Whole: other processes wait for this file and must never read half of it.
    storage.write_atomically(output_path, Path(prefix + ".model").read_bytes())
  logging.info("Vocabulary trained on %d sentences in %.1f s", count, time.time() - start)
  return Tokenizer(output_path)


def load_or_train_tokenizer(path: str | os.PathLike, sentences_fn, *, vocab_path: str = "",
                            vocab_size: int, model_type: str = "bpe",
                            character_coverage: float = 1.0, process_index: int = 0,
                            wait_timeout_s: float = 3600.0,
                            user_defined_symbols: Sequence[str] = ()) -> Tokenizer:
  """A run's vocabulary: `vocab_path` if given, else the one at `path`, else trained there.

  Only process 0 trains (from `sentences_fn()`); other processes wait for the file.
  """
  if vocab_path:
    return Tokenizer(vocab_path)
  path = storage.as_path(path)
  if path.is_file():
    return Tokenizer(path)
  if process_index == 0:
    return train_tokenizer(sentences_fn(), path, vocab_size=vocab_size, model_type=model_type,
                           character_coverage=character_coverage,
                           user_defined_symbols=user_defined_symbols)
  deadline = time.time() + wait_timeout_s
  while not path.is_file():
    if time.time() > deadline:
      raise TimeoutError(f"process {process_index}: no vocabulary at {path} after "
                         f"{wait_timeout_s:.0f} s (process 0 trains it)")
    time.sleep(1.0)
  return Tokenizer(path)
