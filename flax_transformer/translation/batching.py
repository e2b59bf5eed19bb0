"""Length-bucketed batches for evaluation and translation: every example, few shapes.

Examples are sorted by length into token-budgeted batches whose row width is one
of a few buckets, so a jitted step compiles once per bucket. No padding row is
ever confused with data: `index` says which example each row holds.
"""

from __future__ import annotations

import logging
from typing import Iterator, Sequence

import numpy as np


def bucket_length(length: int, multiple: int = 16) -> int:
  """Row width for a sequence: rounded up to a multiple, so few shapes compile."""
  return max(multiple, -(-length // multiple) * multiple)


def batch_rows(width: int, *, batch_tokens: int, row_multiple: int = 1) -> int:
  """Rows of a batch `width` wide: `batch_tokens` // width, a multiple of `row_multiple`."""
  return max(row_multiple, (batch_tokens // width) // row_multiple * row_multiple)


def fitted_rows(needed: int, rows: int, row_multiple: int = 1) -> int:
  """Rows for `needed` examples of a batch of at most `rows`: `row_multiple` times the
  smallest power of two that holds them (a filler row costs as much as a real one)."""
  per_device = -(-needed // row_multiple)
  return min(rows, row_multiple * (1 << max(per_device - 1, 0).bit_length()))


def bucket_widths(lengths: Sequence[int], *, max_length: int, length_multiple: int = 16,
                  max_widths: int | None = None) -> list[int]:
  """Row widths that cover `lengths`: multiples of `length_multiple`, at most `max_widths`.

  Every width is a compiled shape. When the data needs more widths than the cap,
  the kept ones are spread evenly over the needed ones, the widest always kept;
  a sequence goes to the narrowest kept width that holds it.
  """
  cap = bucket_length(max_length, length_multiple)
  needed = sorted({min(bucket_length(n, length_multiple), cap) for n in lengths})
  if max_widths is None or len(needed) <= max_widths:
    return needed
  if max_widths < 1:
    raise ValueError(f"max_widths must be >= 1, got {max_widths}")
  count = len(needed)
  return sorted({needed[-(-(i + 1) * count // max_widths) - 1] for i in range(max_widths)})


def eval_batches(token_ids: Sequence[tuple[np.ndarray, np.ndarray]], *, batch_tokens: int,
                 max_length: int, row_multiple: int = 1, length_multiple: int = 16,
                 max_widths: int | None = None, fit_small: bool = False
                 ) -> Iterator[dict[str, np.ndarray]]:
  """Every example, sorted by length into token-budgeted, padded batches.

  token_ids: (source ids, target ids) per example (target may be empty for
  translation). Sequences longer than `max_length` are truncated (counted and
  logged), never dropped. Yields dicts with `inputs`, `targets` [rows, width]
  and `index` [rows] (position in `token_ids`, -1 for filler rows); rows is a
  multiple of `row_multiple` (the data-parallel size). Rows follow from the
  width, so the batches take at most `max_widths` shapes (`bucket_widths`).
  fit_small: a width whose examples fill less than one batch gets a batch of only the
  rows they need, `row_multiple` times a power of two (`fitted_rows`), so that a short
  input does not pay for a batch of filler rows; a width with more keeps whole batches,
  so an input never compiles more shapes than without it.
  """
  truncated = 0
  lengths = []
  for source, target in token_ids:
    if len(source) > max_length or len(target) > max_length:
      truncated += 1
    lengths.append(min(max(len(source), len(target), 1), max_length))
  if truncated:
    logging.warning("%d of %d sequences are longer than max_len=%d and were truncated",
                    truncated, len(token_ids), max_length)
  widths = bucket_widths(lengths, max_length=max_length, length_multiple=length_multiple,
                         max_widths=max_widths)
  order = np.argsort(np.asarray(lengths), kind="stable")
  start, previous_width = 0, None
  while start < len(order):
    width = next(w for w in widths if w >= lengths[order[start]])
    rows = batch_rows(width, batch_tokens=batch_tokens, row_multiple=row_multiple)
    members = [i for i in order[start:start + rows] if lengths[i] <= width]
    start += len(members)
    if fit_small and width != previous_width and len(members) < rows:  # The width's only.
      rows = fitted_rows(len(members), rows, row_multiple)
    previous_width = width
    batch = {"inputs": np.zeros((rows, width), np.int32),
             "targets": np.zeros((rows, width), np.int32),
             "index": np.full((rows,), -1, np.int32)}
    for row, i in enumerate(members):
      source, target = token_ids[i]
      source, target = source[:max_length], target[:max_length]
      batch["inputs"][row, :len(source)] = source
      batch["targets"][row, :len(target)] = target
      batch["index"][row] = i
    yield batch
