"""Vocabulary padding for tensor sharding: one path for every import (Marian, FSMT,
M2M100/NLLB).

A vocabulary of n ids splits over a tensor axis of t devices only when t divides n:
OPUS-MT's 58,101 ids, and NLLB's 256,206, split over none of 2 or more. Every import
therefore puts each vocabulary's rows (embeddings, a separate pre-softmax matrix, a
final_logits_bias) into a matrix of the next multiple of `MULTIPLE` rows, the added ones
zeros (`take_rows`, one allocation), and says so in the model config (`padded_config`):
`vocab_padding` for the target (shared) vocabulary, whose added rows' logits are -inf
(network/model.py: never produced, no probability, no gradient, and no label-smoothing
class: training/steps.py), `source_vocab_padding` for a separate source vocabulary, whose
added rows are never fed. The tokenizer's vocabulary files name the added ids
'<unused_N>' (`fill_rows`): pieces no tokenizing gives. Exports drop the rows again
(TransformerConfig.without_vocab_padding, export/layout.py), so what they write has the
source folder's shapes. Workdirs imported before this (no padding) load and run as they did.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flax_transformer.errors import DataError
from flax_transformer.network.config import TransformerConfig

# Rows are padded to a multiple of it: any tensor axis of up to 128 devices (a power of
# two) splits them.
MULTIPLE = 128


def padded_rows(rows: int) -> int:
  """The next multiple of MULTIPLE from `rows`."""
  return -(-rows // MULTIPLE) * MULTIPLE


def take_rows(matrix: np.ndarray, order: np.ndarray, axis: int = 0) -> np.ndarray:
  """`matrix` with its entries along `axis` taken in `order` (our id k is its order[k]),
  then zeros up to padded_rows(len(order)): one allocation of the padded size."""
  shape = list(matrix.shape)
  shape[axis] = padded_rows(len(order))
  out = np.zeros(shape, matrix.dtype)
  real = [slice(None)] * matrix.ndim
  real[axis] = slice(0, len(order))
  # mode="clip": `order` is a permutation, and numpy's default mode ("raise") gathers into
  # a hidden buffer the size of `out` first (a third copy of NLLB's 1 GB matrix at the peak).
  np.take(matrix, order, axis=axis, out=out[tuple(real)], mode="clip")
  return out


def padded_config(config: TransformerConfig, target_rows: int,
                  source_rows: int | None = None) -> tuple[TransformerConfig, list[str]]:
  """(`config` with vocab_size and, for a separate source vocabulary of `source_rows`
  ids, source_vocab_size padded and their padding recorded; the run record's notes)."""
  target = padded_rows(target_rows)
  config = config.replace(vocab_size=target, vocab_padding=target - target_rows)
  notes = [] if target == target_rows else [
      f"vocabulary padded from {target_rows} to {target} rows (a multiple of {MULTIPLE}, "
      f"for tensor sharding): ids {target_rows}.. are never produced"]
  if source_rows is not None:
    source = padded_rows(source_rows)
    config = config.replace(source_vocab_size=source, source_vocab_padding=source - source_rows)
    if source != source_rows:
      notes.append(f"source vocabulary padded from {source_rows} to {source} rows: ids "
                   f"{source_rows}.. are never fed")
  return config, notes


def unused_piece(i: int) -> str:
  return f"<unused_{i}>"


def fill_rows(vocab: dict[str, int], rows: int, where: Path) -> dict[str, int]:
  """`vocab` (ids 0..n-1) with '<unused_N>' for the model's rows n..rows-1."""
  if len(vocab) > rows or sorted(vocab.values()) != list(range(len(vocab))):
    raise DataError(f"{where}: the tokenizer's {len(vocab)} ids are not 0..n-1 within the "
                    f"model's vocab_size={rows}")
  added = {unused_piece(i): i for i in range(len(vocab), rows)}
  if taken := sorted(set(added) & set(vocab)):
    raise DataError(f"{where}: the vocabulary already has the piece {taken[0]!r}, the name "
                    "of an added padding row")
  return {**vocab, **added}
