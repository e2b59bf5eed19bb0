"""A corpus's token ids, formed once and memory-mapped: the one-time preparation.

At WMT's size (4.5M pairs) tokenizing every pair as it is drawn costs one
sentencepiece call per sentence in the input path's critical loop. Here every pair
is tokenized once, with all of the host's cores (sentencepiece's own threads), into
two flat files of ids with their offsets; later launches, resumes included, map
them in a fraction of a second, and the pipeline only shuffles and packs.

Layout of a cache folder: `{inputs,targets}.ids` (uint16 where the vocabulary has
fewer than 65,536 pieces, else int32), `{inputs,targets}.offsets` (int64, pairs + 1),
and `meta.json`, written last: a folder without it is never read. The folder's
name is a hash of `key_fields`, everything that decides the ids (the corpus's
files or tfds builder, split and languages in their order, a sample of its pairs,
its size, the vocabulary's bytes); meta.json holds those fields and mapping checks
them, so another corpus, direction or vocabulary never reads stale ids.

A TokenizedPairs pickles as its folder (grain sends the dataset to each input
worker that way): every worker maps the files itself and the page cache holds
one copy of the ids for all of them.
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
from flax_transformer.errors import DataError

CHUNK_PAIRS = 100_000
KEY_SAMPLE_PAIRS = 1024  # Pairs hashed into the key, evenly spread (0.1-0.8 s at 4.5M).
SIDES = ("inputs", "targets")


def default_dir() -> Path:
  return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flax_transformer" / "tokens"


def _mapped(path: Path, dtype) -> np.ndarray:
  """The file's values, memory-mapped read-only (a plain ndarray view: fast indexing)."""
  if path.stat().st_size == 0:
    return np.zeros(0, dtype)
  return np.asarray(np.memmap(path, dtype=dtype, mode="r"))


class TokenizedPairs(Sequence):
  """{'inputs', 'targets'} int32 ids (EOS-terminated) of pair i, read from the files.

  `key`: the `key_fields` the caller expects; a folder whose meta.json holds others
  raises DataError. Pickles as its folder (workers map the files themselves).
  """

  def __init__(self, folder: Path, key: dict | None = None):
    meta = json.loads((folder / "meta.json").read_text())
    if key is not None:
      _check_key(folder, meta.get("key"), key)
    dtype = np.dtype(meta["dtype"])
    self._ids = {s: _mapped(folder / f"{s}.ids", dtype) for s in SIDES}
    self._offsets = {s: _mapped(folder / f"{s}.offsets", np.int64) for s in SIDES}
    self.meta, self.folder = meta, folder

  def __getstate__(self):
    return {"folder": os.fspath(self.folder)}

  def __setstate__(self, state):
    self.__init__(Path(state["folder"]))

  def __len__(self):
    return len(self._offsets["inputs"]) - 1

  def __getitem__(self, i):
    out = {}
    for s in SIDES:
      offsets = self._offsets[s]
      out[s] = np.asarray(self._ids[s][offsets[i]:offsets[i + 1]], np.int32)
    return out


def key_fields(pairs: Sequence, tokenizer: Tokenizer) -> dict:
  """Everything that decides the ids of `pairs` (JSON-able): the source's `identity`
  (files with size and mtime, or tfds builder, version, split and languages in their
  order), a hash of KEY_SAMPLE_PAIRS pairs evenly spread (catches what an identity
  misses: a plain list, a file rewritten in place), the count and the vocabulary."""
  sample = hashlib.sha256()
  step = max(1, len(pairs) // KEY_SAMPLE_PAIRS)
  for source, target in read_pairs(pairs, range(0, len(pairs), step)):
    sample.update(f"{source}\0{target}\0".encode())
  fields = {"corpus": getattr(pairs, "identity", None), "pairs": len(pairs),
            "sample_sha256": sample.hexdigest(),
            "vocabulary_sha256": hashlib.sha256(tokenizer.model_bytes()).hexdigest()}
  return json.loads(json.dumps(fields))  # As meta.json gives it back (lists, not tuples).


def folder_name(label: str, key: dict) -> str:
  """`label` (readable, made file-name safe; its end: file names outlast folders) -
  pair count - hash of the key's fields."""
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[-60:]
  return f"{safe}-{key['pairs']}-{digest}"


def _check_key(folder: Path, stored: dict | None, expected: dict) -> None:
  if stored != expected:
    differ = sorted(k for k in expected if (stored or {}).get(k) != expected[k])
    raise DataError(f"{folder}: token cache of another corpus or vocabulary (meta.json's "
                    f"key differs in {', '.join(differ)}); delete the folder to rebuild it")


def _encode(tokenizer: Tokenizer, texts: list[str], threads: int, dtype):
  ids = tokenizer.encode_batch(texts, num_threads=threads)
  lengths = np.fromiter((len(x) + 1 for x in ids), np.int64, len(ids))  # + EOS.
  flat = np.fromiter((t for x in ids for t in (*x, 1)), dtype, int(lengths.sum()))
  return flat, lengths


def build(pairs: Sequence, tokenizer: Tokenizer, folder: Path, *, threads: int,
          key: dict | None = None) -> None:
  """Tokenizes every (source, target) of `pairs` into `folder` (written whole), with
  `key` (`key_fields`) in its meta.json."""
  sides = dict(zip(SIDES, (tokenizer.source, tokenizer.target)))  # Inputs, targets.
  dtype = np.uint16 if max(t.vocab_size for t in sides.values()) < 2 ** 16 else np.int32
  partial = folder.with_name(f"{folder.name}.partial-{uuid.uuid4().hex[:8]}")
  partial.mkdir(parents=True)
  start, tokens = time.time(), {s: 0 for s in SIDES}
  offsets = {s: [np.zeros(1, np.int64)] for s in SIDES}
  files = {s: open(partial / f"{s}.ids", "wb") for s in SIDES}
  try:
    for begin in range(0, len(pairs), CHUNK_PAIRS):
      chunk = read_pairs(pairs, range(begin, min(len(pairs), begin + CHUNK_PAIRS)))
      for side, texts in zip(SIDES, zip(*chunk)):
        flat, lengths = _encode(sides[side], list(texts), threads, dtype)
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
      "vocab_size": tokenizer.vocab_size, "seconds": time.time() - start, "key": key}))
  try:
    os.replace(partial, folder)
  except OSError:  # Another process finished the same cache first: keep theirs.
    shutil.rmtree(partial, ignore_errors=True)


def _mention_others(folder: Path) -> None:
  """Logs the caches beside `folder` of the same corpus label (another vocabulary,
  direction, or an older key): they stay until deleted, which only the user can decide."""
  label = folder.name.rsplit("-", 2)[0]
  others = [f for f in folder.parent.glob(f"{label}-*")
            if f != folder and (f / "meta.json").is_file()]
  if others:
    size = sum(p.stat().st_size for f in others for p in f.iterdir() if p.is_file())
    logging.info("%d other token cache(s) of %s in %s (%.2f GB; delete what no run needs): %s",
                 len(others), label, folder.parent, size / 1e9, ", ".join(f.name for f in others))


def load_or_build(pairs: Sequence, tokenizer: Tokenizer, cache_dir: str | os.PathLike = "",
           threads: int | None = None) -> TokenizedPairs:
  """The ids of every pair of `pairs` from the cache in `cache_dir` (default
  ~/.cache/flax_transformer/tokens), built now if missing. The folder is found by
  `key_fields` and labelled with `pairs.name` where the source has one."""
  key = key_fields(pairs, tokenizer)
  folder = Path(cache_dir or default_dir()) / folder_name(getattr(pairs, "name", "corpus"), key)
  if not (folder / "meta.json").is_file():
    logging.info("Tokenizing %d pairs once into %s (later launches map it)", len(pairs), folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _mention_others(folder)
    build(pairs, tokenizer, folder, threads=threads or os.cpu_count() or 1, key=key)
  ids = TokenizedPairs(folder, key=key)
  logging.info("Token ids of %d pairs mapped from %s (%d + %d tokens)", len(ids), folder,
               ids.meta["tokens"]["inputs"], ids.meta["tokens"]["targets"])
  return ids
