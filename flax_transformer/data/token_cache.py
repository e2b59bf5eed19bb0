"""A corpus's token ids, formed once and memory-mapped: the one-time preparation.

At WMT's size (4.5M pairs) tokenizing every pair as it is drawn costs one
sentencepiece call per sentence in the input path's critical loop. Here every pair
is tokenized once, with all of the host's cores (sentencepiece's own threads), into
two flat files of ids with their offsets; later launches, resumes included, map
them in a fraction of a second, and the pipeline only shuffles and packs.

Layout of a cache folder: `{inputs,targets}.ids` (uint16 where the vocabulary has
fewer than 65,536 pieces, else int32), `{inputs,targets}.offsets` (int64, pairs + 1),
and `meta.json`, written last: a folder without it is never read. The folder's
name is derived from the vocabulary's bytes and the corpus's name and size, so a
new vocabulary or corpus never reads stale ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Sequence

import numpy as np

from flax_transformer.data.sources import read_pairs
from flax_transformer.data.tokenizer import Tokenizer

CHUNK_PAIRS = 100_000
SIDES = ("inputs", "targets")


def default_dir() -> Path:
  return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flax_transformer" / "tokens"


class TokenizedPairs(Sequence):
  """{'inputs', 'targets'} int32 ids (EOS-terminated) of pair i, read from the files."""

  def __init__(self, folder: Path):
    meta = json.loads((folder / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    self._ids = {s: np.memmap(folder / f"{s}.ids", dtype=dtype, mode="r")
                 if meta["tokens"][s] else np.zeros(0, dtype) for s in SIDES}
    self._offsets = {s: np.fromfile(folder / f"{s}.offsets", dtype=np.int64) for s in SIDES}
    self.meta, self.folder = meta, folder

  def __len__(self):
    return len(self._offsets["inputs"]) - 1

  def __getitem__(self, i):
    out = {}
    for s in SIDES:
      offsets = self._offsets[s]
      out[s] = np.asarray(self._ids[s][offsets[i]:offsets[i + 1]], np.int32)
    return out


def _key(tokenizer: Tokenizer, name: str, count: int) -> str:
  digest = hashlib.sha256(tokenizer.model_bytes())
  digest.update(f"{name}\0{count}".encode())
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]
  return f"{safe}-{count}-{digest.hexdigest()[:16]}"


def _encode(tokenizer: Tokenizer, texts: list[str], threads: int, dtype):
  ids = tokenizer.encode_batch(texts, num_threads=threads)
  lengths = np.fromiter((len(x) + 1 for x in ids), np.int64, len(ids))  # + EOS.
  flat = np.fromiter((t for x in ids for t in (*x, 1)), dtype, int(lengths.sum()))
  return flat, lengths


def build(pairs: Sequence, tokenizer: Tokenizer, folder: Path, *, threads: int) -> None:
  """Tokenizes every (source, target) of `pairs` into `folder` (written whole)."""
  dtype = np.uint16 if tokenizer.vocab_size < 2 ** 16 else np.int32
  partial = folder.with_name(f"{folder.name}.partial-{uuid.uuid4().hex[:8]}")
  partial.mkdir(parents=True)
  start, tokens = time.time(), {s: 0 for s in SIDES}
  offsets = {s: [np.zeros(1, np.int64)] for s in SIDES}
  files = {s: open(partial / f"{s}.ids", "wb") for s in SIDES}
  try:
    for begin in range(0, len(pairs), CHUNK_PAIRS):
      chunk = read_pairs(pairs, range(begin, min(len(pairs), begin + CHUNK_PAIRS)))
      for side, texts in zip(SIDES, zip(*chunk)):
        flat, lengths = _encode(tokenizer, list(texts), threads, dtype)
        files[side].write(flat.tobytes())
        offsets[side].append(tokens[side] + np.cumsum(lengths))
        tokens[side] += int(lengths.sum())
      done = begin + len(chunk)
      rate = done / max(1e-9, time.time() - start)
      logging.info("Tokenizing %s: %d/%d pairs, %.0f pairs/s, ETA %.0f s", folder.name, done,
                   len(pairs), rate, (len(pairs) - done) / rate)
  finally:
    for f in files.values():
      f.close()
  for side in SIDES:
    np.concatenate(offsets[side]).tofile(partial / f"{side}.offsets")
  (partial / "meta.json").write_text(json.dumps({
      "pairs": len(pairs), "tokens": tokens, "dtype": np.dtype(dtype).name,
      "vocab_size": tokenizer.vocab_size, "seconds": time.time() - start}))
  try:
    os.replace(partial, folder)
  except OSError:  # Another process finished the same cache first: keep theirs.
    shutil.rmtree(partial, ignore_errors=True)


def cached(pairs: Sequence, tokenizer: Tokenizer, name: str, cache_dir: str | os.PathLike = "",
           threads: int | None = None) -> TokenizedPairs:
  """The ids of every pair of `pairs` (named `name`, e.g. 'wmt14_translate/de-en:train'),
  from the cache in `cache_dir` (default ~/.cache/flax_transformer/tokens), built now if
  missing."""
  folder = Path(cache_dir or default_dir()) / _key(tokenizer, name, len(pairs))
  if not (folder / "meta.json").is_file():
    logging.info("Tokenizing %d pairs once into %s (later launches map it)", len(pairs), folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    build(pairs, tokenizer, folder, threads=threads or os.cpu_count() or 1)
  ids = TokenizedPairs(folder)
  logging.info("Token ids of %d pairs mapped from %s (%d + %d tokens)", len(ids), folder,
               ids.meta["tokens"]["inputs"], ids.meta["tokens"]["targets"])
  return ids
