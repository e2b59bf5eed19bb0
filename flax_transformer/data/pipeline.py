"""Batches of token ids: packed training rows, length-bucketed eval batches, placement.

A training batch is a dict of int32 [rows, length] arrays: `inputs`, `targets`
and, when packed, `inputs_segmentation`, `targets_segmentation` (which pair a
token belongs to, 0 = padding) and `inputs_positions`, `targets_positions`
(index within the pair). Token id 0 is padding.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Iterator, Sequence

import grain
import jax
import numpy as np
from grain import experimental as grain_experimental

from flax_transformer import host
from flax_transformer.data import multilingual, token_cache
from flax_transformer.data.sources import read_pairs
from flax_transformer.data.tokenizer import Tokenizer, load_or_train_tokenizer

READ_THREADS = 0  # Reading in this thread: grain's read-ahead threads cost more than they save here.
_PACKED_RENAMES = {"inputs_segment_ids": "inputs_segmentation",
                   "targets_segment_ids": "targets_segmentation"}


class TokenizePair:
  """(source, target) strings -> {'inputs', 'targets'} int32 ids ending in EOS, each by
  its side of the tokenizer (`source`, `target`: one vocabulary shared by both, or an
  imported model's two).

  With `sampling_alpha` > 0 (subword regularisation), each call draws one sampled
  segmentation seeded from `rng`; otherwise the deterministic one, and `rng` is unused.
  """

  def __init__(self, tokenizer: Tokenizer, sampling_alpha: float = 0.0):
    self.tokenizer = tokenizer
    self.sampling_alpha = sampling_alpha

  def __call__(self, pair, rng: np.random.Generator | None = None):
    if self.sampling_alpha > 0:
      inputs, targets = self.tokenizer.tokenize_sampled(
          pair, alpha=self.sampling_alpha, seed=int(rng.integers(1, 2**31)))
    else:
      inputs = self.tokenizer.source.tokenize(pair[0])
      targets = self.tokenizer.target.tokenize(pair[1])
    return {"inputs": inputs, "targets": targets}


PRETOKENIZE_MAX_PAIRS = 1_000_000  # Above this, ids go to a token cache on disk (memory).


def pretokenized(pairs: Sequence, tokenize: TokenizePair, *,
                 cache_dir: str = "") -> Sequence[dict[str, np.ndarray]] | None:
  """Every pair's ids, formed once, where that gives the same stream as `tokenize`.

  A deterministic segmentation (no subword sampling): the pipeline then only
  shuffles and packs, and tokenizing leaves every step's critical path. Up to
  PRETOKENIZE_MAX_PAIRS pairs are held in memory; larger corpora (WMT) go to a
  memory-mapped token cache in `cache_dir` (data.token_cache), keyed by what
  decides the ids (token_cache.key_fields), built once with every core and reused
  by later launches. None with sampling.
  """
  if tokenize.sampling_alpha > 0:
    return None
  if len(pairs) > PRETOKENIZE_MAX_PAIRS:
    return token_cache.load_or_build(pairs, tokenize.tokenizer, cache_dir)
  start = time.perf_counter()
  out = [tokenize(pair) for pair in read_pairs(pairs, range(len(pairs)))]
  logging.info("Tokenized %d training pairs once in %.1f s", len(out),
               time.perf_counter() - start)
  return out


def training_ids(config, pairs: Sequence, tokenize: TokenizePair):
  """`pretokenized` for the config's training split, in its token cache."""
  return pretokenized(pairs, tokenize, cache_dir=config.token_cache_dir)


def _fits(max_source_length: int, max_target_length: int):
  def keep(example) -> bool:
    return (len(example["inputs"]) <= max_source_length
            and len(example["targets"]) <= max_target_length)
  return keep


def _pad_example(lengths: dict[str, int]):
  def pad(example):
    return {k: np.pad(v, (0, lengths[k] - len(v))) for k, v in example.items()}
  return pad


def _rename_packed(batch):
  return {_PACKED_RENAMES.get(k, k): v for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class TrainBatching:
  """How training batches are formed.

  rows: rows per host batch (global rows / process count).
  max_source_length / max_target_length: row widths; longer pairs are filtered.
  packing: several pairs per row (segment ids, positions), else one pair per row.
  """

  rows: int
  max_source_length: int
  max_target_length: int
  packing: bool = True

  def abstract_batch(self, process_count: int, sharding: jax.sharding.Sharding) -> dict:
    """The global batch `train_dataset`'s host batches make on the devices, as
    ShapeDtypeStructs: what the train step compiles for before any data is read."""
    keys = ("inputs", "targets") + ((
        "inputs_segmentation", "targets_segmentation", "inputs_positions",
        "targets_positions") if self.packing else ())
    rows = self.rows * process_count
    return {k: jax.ShapeDtypeStruct(
        (rows, self.max_source_length if k.startswith("inputs") else self.max_target_length),
        np.int32, sharding=sharding) for k in keys}


def train_dataset(examples: Sequence | grain.MapDataset, batching: TrainBatching, *, seed: int,
                  process_index: int = 0, process_count: int = 1,
                  num_epochs: int | None = None, tokenize=None) -> grain.IterDataset:
  """Shuffled, filtered, packed or padded, batched training stream of this host.

  Each host reads a disjoint 1/process_count of the examples; epochs are
  reshuffled. `tokenize(example, rng) -> example` (e.g. `TokenizePair`), if given,
  turns raw examples into ids after the shuffle, so it sees every epoch's
  occurrence of a pair with its own rng (seeded by `seed` and the position in the
  stream: deterministic, resumable).
  `num_epochs=None` repeats forever; with a finite count, the last batch is
  completed with all-padding rows so that no pair is dropped.
  Iterators of the result support `get_state()` / `set_state()` for resuming.
  """
  if not isinstance(examples, grain.MapDataset):
    examples = grain.MapDataset.source(examples)
  ds = examples[process_index::process_count].shuffle(seed=seed).repeat(num_epochs)
  if tokenize is not None:
    ds = ds.random_map(tokenize, seed=seed)
  ds = ds.filter(_fits(batching.max_source_length, batching.max_target_length))
  lengths = {"inputs": batching.max_source_length, "targets": batching.max_target_length}
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=32))
  if batching.packing:
    it = grain_experimental.FirstFitPackIterDataset(
        it, length_struct=lengths, num_packing_bins=batching.rows, shuffle_bins=True,
        seed=seed)
    it = it.map(_rename_packed)
  else:
    it = it.map(_pad_example(lengths))
  it = it.batch(batching.rows, drop_remainder=False)
  return it.map(_complete_rows(batching.rows))


def _complete_rows(rows: int):
  def complete(batch):
    missing = rows - next(iter(batch.values())).shape[0]
    if missing == 0:
      return batch
    return {k: np.pad(v, ((0, missing), (0, 0))) for k, v in batch.items()}
  return complete


def nonpad_fraction(batch) -> float:
  """Share of non-padding positions over inputs and targets."""
  real = sum(int((batch[k] != 0).sum()) for k in ("inputs", "targets"))
  total = batch["inputs"].size + batch["targets"].size
  return real / total


# --- Placement ------------------------------------------------------------------

def auto_workers(requested: int) -> int:
  """Worker processes for the input pipeline: `requested`, or with -1 one per 2 cores
  (at most 8) on hosts of 8 cores or more, and none on smaller ones, where the
  workers would take cores from XLA's own threads."""
  if requested >= 0:
    return requested
  cores = host.usable_cores()
  return 0 if cores < 8 else min(8, cores // 2)


def prefetched(ds: grain.IterDataset, place, *, workers: int = 0, host_buffer: int = 4,
               device_buffer: int = 2) -> grain.IterDataset:
  """`ds` formed ahead of use and placed on the devices ahead of the step that needs it.

  workers > 0: batches are formed in that many processes (grain `mp_prefetch`;
  the batch order then depends on the worker count). A thread keeps
  `host_buffer` batches ready and another runs `place` (host arrays -> sharded
  device arrays) `device_buffer` batches ahead, so neither tokenizing, packing
  nor the copy to the device waits in the step loop. Iterator state counts only
  the batches handed out, so a checkpoint taken between steps resumes exactly.
  """
  if workers > 0:
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  ds = grain_experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=host_buffer)
  ds = ds.map(place)
  if device_buffer > 0:
    ds = grain_experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=device_buffer)
  return ds


def host_rows(batch: dict[str, np.ndarray], process_index: int, process_count: int):
  """This host's contiguous share of a global batch's rows."""
  rows = next(iter(batch.values())).shape[0]
  if rows % process_count:
    raise ValueError(f"batch of {rows} rows does not split over {process_count} processes")
  size = rows // process_count
  return {k: v[process_index * size:(process_index + 1) * size] for k, v in batch.items()}


def shard_host_rows(local_batch: dict[str, np.ndarray],
                     sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """Host-local rows -> global `jax.Array`s sharded over the mesh's batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in local_batch.items()}


def shard_global_batch(batch: dict[str, np.ndarray],
                       sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """A global batch every host holds (evaluation, BLEU) -> global `jax.Array`s, each
  host placing its own rows."""
  return shard_host_rows(host_rows(batch, jax.process_index(), jax.process_count()), sharding)


# --- From a config ----------------------------------------------------------------

def vocabulary_sentences(pairs: Sequence, max_sentences: int) -> Iterator[str]:
  """Source and target sentences of up to `max_sentences` pairs, evenly spread."""
  step = max(1, len(pairs) // max(1, max_sentences))
  indices = range(0, len(pairs), step)
  for begin in range(0, len(indices), 10_000):  # Batched reads: far faster from array_record.
    for source, target in read_pairs(pairs, indices[begin:begin + 10_000]):
      yield source
      yield target


def build_tokenizer(config, path: str | os.PathLike, train_pairs: Sequence,
                    process_index: int = 0) -> Tokenizer:
  """The shared vocabulary: config.vocab_path, or the one at `path` (the workdir's), or
  trained now into `path`."""
  return load_or_train_tokenizer(
      path, lambda: vocabulary_sentences(train_pairs, config.vocab_max_sentences),
      vocab_path=config.vocab_path, vocab_size=config.vocab_size,
      model_type=config.vocab_model_type,
      character_coverage=config.vocab_character_coverage, process_index=process_index,
      user_defined_symbols=multilingual.pieces(config))


def train_batching(config, data_parallel_size: int, process_count: int = 1) -> TrainBatching:
  """Rows per host from `config.batch_tokens` (or `per_device_batch_size`)."""
  if config.per_device_batch_size > 0:
    global_rows = config.per_device_batch_size * data_parallel_size
  else:
    global_rows = max(1, config.batch_tokens // config.max_target_length)
    global_rows = max(data_parallel_size,
                      global_rows // data_parallel_size * data_parallel_size)
  if global_rows % process_count:
    raise ValueError(f"global batch of {global_rows} rows does not split over "
                     f"{process_count} processes")
  return TrainBatching(rows=global_rows // process_count,
                       max_source_length=config.max_source_length,
                       max_target_length=config.max_target_length,
                       packing=config.packing)


def training_input(config, train_pairs: Sequence, tokenizer: Tokenizer,
                   batching: TrainBatching, place) -> Iterator:
  """train.py's iterator of training batches on the devices (`place`: host rows -> global
  arrays), tokenized through the token cache where the corpus is large enough,
  prefetched; its state is checkpointed."""
  workers = auto_workers(config.data_workers)
  tokenize = TokenizePair(tokenizer, config.subword_sampling_alpha)
  train_ids = training_ids(config, train_pairs, tokenize)
  train_iter = iter(prefetched(
      train_dataset(
          train_pairs if train_ids is None else train_ids, batching, seed=config.seed,
          process_index=jax.process_index(), process_count=jax.process_count(),
          tokenize=tokenize if train_ids is None else None),
      place, workers=workers, device_buffer=config.prefetch_batches))
  logging.info("Input pipeline: %d worker process(es), %d batch(es) prefetched to the devices",
               workers, config.prefetch_batches)
  return train_iter


INPUT_CLOSE_TIMEOUT_S = 30.0


def close_input(iterator, timeout_s: float = INPUT_CLOSE_TIMEOUT_S) -> None:
  """Stops an input iterator's prefetch threads and worker processes, waiting at most
  `timeout_s` seconds.

  Bounded because grain's ThreadPrefetchDatasetIterator.close joins its producer thread
  with no timeout, forever if the producer is blocked in its parent's __next__ (grain
  PR #1373); those threads and grain's worker processes are daemons, ended with this
  process. An iterator without `close` (grain before DatasetIterator.close) is left to
  the garbage collector. An error of `close` is raised here.
  """
  close = getattr(iterator, "close", None)
  if close is None:
    return
  errors = []

  def run():
    try:
      close()
    except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
      errors.append(e)

  closer = threading.Thread(target=run, name="close_input", daemon=True)
  closer.start()
  closer.join(timeout_s)
  if closer.is_alive():
    logging.warning("The input pipeline did not stop within %.0f s; its threads and worker "
                    "processes end with this process", timeout_s)
  elif errors:
    raise errors[0]
