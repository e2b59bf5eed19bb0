"""Parallel corpora as random-access sequences of (source, target) sentence pairs.

Three kinds: tensorflow-datasets translation builders (prepared as array_record,
read with `tfds.data_source`, no TensorFlow needed), Multi30k (public raw files,
fetched or read from a local folder), and a user's own line-aligned text files.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import importlib
import logging
import os
from pathlib import Path
from typing import Callable, Sequence

from flax_transformer import storage
from flax_transformer.data.download import download
from flax_transformer.errors import DataError


class TextPairs(Sequence):
  """In-memory (source, target) pairs.

  `identity`: what decides the pairs (JSON-able; e.g. the files read, `file_identity`),
  part of the token cache's key.
  """

  def __init__(self, sources: list[str], targets: list[str], name: str = "text",
               identity: dict | None = None):
    if len(sources) != len(targets):
      raise DataError(f"{name}: {len(sources)} source lines but {len(targets)} target lines")
    self.sources, self.targets, self.name = sources, targets, name
    self.identity = identity

  def __len__(self):
    return len(self.sources)

  def __getitem__(self, i):
    return self.sources[i], self.targets[i]


def read_lines(path: str | os.PathLike) -> list[str]:
  """UTF-8 lines of a plain or .gz file, without line terminators.

  Raises DataError naming the file (and line) when it is missing, empty, not
  gzip despite its name, or not valid UTF-8.
  """
  path = Path(path)
  if not path.is_file():
    raise DataError(f"{path}: no such file")
  opener = gzip.open if path.suffix == ".gz" else open
  lines = []
  try:
    with opener(path, "rb") as f:
      for number, raw in enumerate(f, start=1):
        try:
          lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as e:
          raise DataError(f"{path}:{number}: invalid UTF-8 at byte {e.start}") from None
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError.
    raise DataError(f"{path}: cannot read ({e})") from None
  if not lines:
    raise DataError(f"{path}: file is empty")
  return lines


def split_lines_lenient(raw: bytes) -> tuple[list[str], list[int]]:
  """bytes -> (lines, 1-based numbers of lines that were not valid UTF-8).

  Splits on '\n' only (a final newline ends the last line), strips one '\r',
  and replaces undecodable bytes with U+FFFD, so no line is lost or merged.
  """
  parts = raw.split(b"\n")
  if parts and parts[-1] == b"":
    parts.pop()
  lines, invalid = [], []
  for number, part in enumerate(parts, start=1):
    if part.endswith(b"\r"):
      part = part[:-1]
    try:
      lines.append(part.decode("utf-8"))
    except UnicodeDecodeError:
      lines.append(part.decode("utf-8", errors="replace"))
      invalid.append(number)
  return lines, invalid


def read_parallel_files(source_path, target_path) -> TextPairs:
  """Line-aligned source/target files -> TextPairs; counts must match."""
  sources, targets = read_lines(source_path), read_lines(target_path)
  if len(sources) != len(targets):
    raise DataError(f"line counts differ: {source_path} has {len(sources)} lines, "
                    f"{target_path} has {len(targets)}")
  return TextPairs(sources, targets, name=f"{source_path} | {target_path}",
                   identity={"files": [file_identity(source_path), file_identity(target_path)]})


def file_identity(path: str | os.PathLike) -> dict:
  """A file as the token cache's key knows it: absolute path, bytes and mtime (ns)."""
  stat = Path(path).stat()
  return {"path": os.path.abspath(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


# --- Multi30k -----------------------------------------------------------------

MULTI30K_URL = ("https://raw.githubusercontent.com/multi30k/dataset/"
                "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/{file}")
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test_2016_flickr": "test_2016_flickr"}
MULTI30K_LANGS = ("en", "de", "fr")
MULTI30K_SHA256 = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def _sha256(path: Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def fetch_multi30k_file(file: str, cache_dir: Path, url_template: str = MULTI30K_URL) -> Path:
  """Downloads one Multi30k file into `cache_dir` (once), checking its SHA-256."""
  target = cache_dir / file
  if target.is_file() and _sha256(target) == MULTI30K_SHA256[file]:
    return target
  cache_dir.mkdir(parents=True, exist_ok=True)
  url = url_template.format(file=file)
  logging.info("Downloading %s", url)

  def check(partial: Path) -> None:
    if _sha256(partial) != MULTI30K_SHA256[file]:
      raise DataError(f"{url}: checksum mismatch (download corrupted or file changed)")

  download(url, target, timeout_s=60, check=check,
           hint="with no internet, set config.manual_dir to a folder holding the raw .gz files")
  return target


def multi30k_cache(data_dir: str = "") -> Path:
  """Where Multi30k's fetched files go: `data_dir`/multi30k, default ~/.cache/flax_transformer."""
  return Path(data_dir or Path.home() / ".cache" / "flax_transformer") / "multi30k"


def multi30k(split: str, source_lang: str, target_lang: str, *, manual_dir: str = "",
             data_dir: str = "", local_copy: str = "") -> TextPairs:
  """Multi30k task 1 pairs for `split` in 'train' | 'validation' | 'test_2016_flickr'.

  Read from `manual_dir` when given (each file must be there); else from `local_copy`
  for each file it holds; else fetched from the dataset's public repository
  (MULTI30K_URL) into `data_dir`/multi30k (default ~/.cache/flax_transformer). One
  log line says which.
  """
  if split not in MULTI30K_SPLITS:
    raise DataError(f"multi30k has no split {split!r}; splits: {', '.join(MULTI30K_SPLITS)}")
  for lang in (source_lang, target_lang):
    if lang not in MULTI30K_LANGS:
      raise DataError(f"multi30k has no language {lang!r}; languages: {MULTI30K_LANGS}")
  paths, local, fetched = [], [], []
  cache = multi30k_cache(data_dir)
  for lang in (source_lang, target_lang):
    file = f"{MULTI30K_SPLITS[split]}.{lang}.gz"
    if manual_dir:
      path = Path(manual_dir) / file
      if not path.is_file():
        raise DataError(f"{path}: no such file (config.manual_dir={manual_dir!r} should hold "
                        f"the Multi30k raw .gz files)")
    elif local_copy and (Path(local_copy) / file).is_file():
      path = Path(local_copy) / file
      local.append(file)
    else:
      path = fetch_multi30k_file(file, cache, MULTI30K_URL)  # The module's, now.
      fetched.append(file)
    paths.append(path)
  if local:
    logging.info("Multi30k %s: %s read from the local copy %s", split, ", ".join(local),
                 os.path.abspath(local_copy))
  if fetched:
    logging.info("Multi30k %s: %s fetched from the public repository into %s (%s)", split,
                 ", ".join(fetched), cache, f"no local copy in {os.path.abspath(local_copy)}"
                 if local_copy else "config.local_copy unset")
  return read_parallel_files(*paths)


# --- tensorflow-datasets -------------------------------------------------------

def _import_tfds_module(name: str) -> None:
  """Registers a catalog builder such as 'wmt14_translate/de-en'.

  Without TensorFlow, tfds cannot import its whole catalog, so builders are
  found only once their own module is imported.
  """
  family = name.split("/")[0].split(":")[0]
  if family.endswith("_translate"):
    try:
      importlib.import_module(f"tensorflow_datasets.translate.{family[:-len('_translate')]}")
    except ImportError:
      pass  # Not a catalog module: tfds's own lookup reports the name.


def tfds_builder(name: str, data_dir: str | None):
  """tfds's builder `name` (e.g. 'wmt14_translate/de-en') writing array_record."""
  import tensorflow_datasets as tfds

  _import_tfds_module(name)
  try:
    return tfds.builder(name, data_dir=data_dir or None, file_format="array_record")
  except Exception as e:  # tfds raises several unrelated types for unknown names.
    raise DataError(f"tfds dataset {name!r}: {e}") from None


def prepare_builder(builder, *, manual_dir: str = "", download: bool = True) -> None:
  """Prepares a tfds builder as array_record (WMT ones through `data.wmt`).

  manual_dir: a folder of already downloaded source files under their download
  names (tfds's manual folder); download=False refuses to fetch anything.
  """
  import tensorflow_datasets as tfds

  from flax_transformer.data import wmt

  name = builder.info.full_name
  logging.info("Preparing tfds %s in %s (array_record)", name, builder.data_dir)
  if wmt.is_wmt(builder):
    logging.info("%s downloads %.2f GB of archives (tfds's registered sizes)", name,
                 wmt.download_size(builder) / 1e9)
    wmt.prepare_from_archives(builder, manual_dir, download=download)
    return
  if not download:
    raise DataError(f"tfds dataset {name!r} is not prepared in {builder.data_dir}")
  with wmt.in_memory_shuffle():  # Not WMT only: any split over 1 GB needs it.
    builder.download_and_prepare(
        file_format="array_record",
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir or None))


class TfdsPairs(Sequence):
  """A tfds translation split read through `tfds.data_source` (array_record)."""

  def __init__(self, name: str, split: str, source_lang: str, target_lang: str,
               data_dir: str = "", download: bool = True, manual_dir: str = ""):
    import tensorflow_datasets as tfds  # Heavy import, only when used.

    data_dir = data_dir or None
    builder = tfds_builder(name, data_dir)
    if not builder.is_prepared():
      prepare_builder(builder, manual_dir=manual_dir, download=download)
    if split not in builder.info.splits:
      raise DataError(f"tfds dataset {name!r} has no split {split!r}; splits: "
                      f"{', '.join(builder.info.splits)}")
    languages = set(builder.info.features.keys())
    for lang in (source_lang, target_lang):
      if lang not in languages:
        raise DataError(f"tfds dataset {name!r} has no language {lang!r}; "
                        f"features: {sorted(languages)}")
    self._source = tfds.data_source(name, split=split, data_dir=data_dir)
    self.source_lang, self.target_lang = source_lang, target_lang
    self.name = f"{name}:{split}"
    # WMT14's one config serves both directions: the languages' order is part of it.
    self.identity = {"tfds": builder.info.full_name, "data_dir": os.fspath(builder.data_dir),
                     "split": split, "source_lang": source_lang, "target_lang": target_lang}

  def __len__(self):
    return len(self._source)

  def __getitem__(self, i):
    return self._pair(self._source[i])

  def __getitems__(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    """Many pairs in one read (about 6x faster a pair than one by one)."""
    return [self._pair(record) for record in self._source.__getitems__(list(indices))]

  def _pair(self, record) -> tuple[str, str]:
    text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)  # noqa: E731
    return text(record[self.source_lang]), text(record[self.target_lang])


def read_pairs(pairs: Sequence, indices: Sequence[int]) -> list[tuple[str, str]]:
  """pairs[i] for each i, in one batched read where the source offers one."""
  many = getattr(pairs, "__getitems__", None)
  return many(indices) if many else [pairs[i] for i in indices]


@contextlib.contextmanager
def _one_at_a_time(data_dir: str):
  """Holds an exclusive lock (flock) on a file in a local `data_dir`: processes of one
  host take turns there. A bucket needs none: process 0 prepared it for everyone."""
  if storage.is_remote(data_dir):
    yield
    return
  Path(data_dir).mkdir(parents=True, exist_ok=True)
  path = Path(data_dir) / ".flax_transformer_prepare.lock"
  with open(path, "a") as lock:
    try:  # Released when the file closes, or its process dies.
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info("Waiting for another process of this host preparing the data in %s "
                   "(it holds %s)", data_dir, path)
      fcntl.flock(lock, fcntl.LOCK_EX)
    except OSError as e:  # A file system without flock (Lustre without -o flock).
      logging.warning("Cannot lock %s (%s): preparing without taking turns with this "
                      "host's other processes", path, e)
    yield


def prepare_datasets(config, process_index: int = 0, process_count: int = 1,
            barrier: Callable[[str], None] | None = None) -> list[str]:
  """Prepares the config's tfds datasets (training and evaluation) once, before a run.

  Several processes: process 0 prepares while the others wait for it at `barrier`
  (`barrier(name)` returns once every process called it: the loop passes
  jax.distributed's; unused with one process), then each of the others finds
  the data prepared, or, where its data_dir is its host's own, the first of that
  host's processes prepares its copy while the others wait for it (a file lock in the
  data_dir) and find it prepared.
  Returns one line per dataset: its splits and sizes. Multi30k and text files need
  nothing prepared.
  """
  if process_count > 1 and barrier is None:
    raise ValueError("prepare: several processes need a barrier")
  if process_index != 0:
    barrier("flax_transformer_prepare_data")
  lines = []
  names = [config.dataset_name, config.eval_dataset_name or config.dataset_name]
  for name in dict.fromkeys(names):
    if name in ("multi30k", "text"):
      lines.append(f"{name}: nothing to prepare")
      continue
    with _one_at_a_time(tfds_builder(name, config.data_dir).data_dir_root):
      builder = tfds_builder(name, config.data_dir)  # Sees what the lock's last holder wrote.
      if not builder.is_prepared():
        prepare_builder(builder, manual_dir=config.manual_dir)
    splits = ", ".join(f"{s} {info.num_examples:,}" for s, info in builder.info.splits.items())
    lines.append(f"{name}: prepared in {builder.data_dir} ({splits})")
  if process_index == 0 and process_count > 1:
    barrier("flax_transformer_prepare_data")
  return lines


def load_pairs(config, split: str, dataset_name: str | None = None,
               model_languages=None) -> Sequence:
  """The (source, target) pairs of `split` for the config's dataset.

  `config.dataset_name`: 'multi30k', 'text' (config.{train,eval}_{source,target}_file),
  or any tfds translation builder name. `model_languages`: a fine-tuning source's record
  (config.languages names its codes: data.multilingual.of_model)."""
  name = dataset_name or config.dataset_name
  if config.get("languages"):  # Every direction between them, each loaded as one pair.
    from flax_transformer.data import multilingual
    return multilingual.load(config, split, lambda one: load_pairs(one, split, name),
                             model_languages)
  if name == "multi30k":
    pairs = multi30k(split, config.source_lang, config.target_lang,
                     manual_dir=config.manual_dir, data_dir=config.data_dir,
                     local_copy=config.get("local_copy", ""))
  elif name == "text":
    prefix = "train" if split == config.train_split else "eval"
    src, tgt = config[f"{prefix}_source_file"], config[f"{prefix}_target_file"]
    if not src or not tgt:
      raise DataError(f"dataset_name='text' needs config.{prefix}_source_file and "
                      f"config.{prefix}_target_file")
    pairs = read_parallel_files(src, tgt)
  else:
    pairs = TfdsPairs(name, split, config.source_lang, config.target_lang, config.data_dir,
                      manual_dir=config.manual_dir)
  source_prefix = config.get("source_prefix", "")
  return SourcePrefixed(pairs, source_prefix) if source_prefix else pairs


class SourcePrefixed(Sequence):
  """`pairs` with `prefix` before every source text (`config.source_prefix`: a multilingual
  model's target-language tag). Its identity, part of the token cache's key, names it."""

  def __init__(self, pairs: Sequence, prefix: str):
    self.pairs, self.prefix = pairs, prefix
    self.name = getattr(pairs, "name", "corpus")
    self.identity = {"pairs": getattr(pairs, "identity", None), "source_prefix": prefix}

  def __len__(self):
    return len(self.pairs)

  def __getitem__(self, i):
    source, target = self.pairs[i]
    return self.prefix + source, target

  def __getitems__(self, indices):
    return [(self.prefix + s, t) for s, t in read_pairs(self.pairs, indices)]
