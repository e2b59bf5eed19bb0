"""tfds's own WMT builders (`wmt14_translate/de-en`, ...) prepared without TensorFlow.

tfds downloads, verifies and parses the statmt.org archives itself, but its archive
extractor writes through `tf.io.gfile`, so without TensorFlow `download_and_prepare`
stops at the first archive ("No module named 'tensorflow'"). Here the archives are
fetched into the manual folder (sequentially: statmt.org refuses parallel
downloads), unpacked with Python's tarfile into the folder where tfds looks for an
earlier extraction, and then tfds's `download_and_prepare` runs as usual: it takes
the archives from the manual folder, checks each against the size and SHA-256 it
registers for its URL, reuses the extraction, parses every subset and writes
array_record.

One more place needs TensorFlow: tfds's writer shuffles a split in memory up to
`tensorflow_datasets.core.shuffle.MAX_MEM_BUFFER_SIZE` (1 GB of serialized
examples) and spills larger splits to disk through `tf.io.gfile`; WMT14 EN-DE's
training split is 1.4 GB. Without TensorFlow, `in_memory_shuffle` raises that
limit to half the host's memory for the preparation (the one tfds constant this
module changes); a split larger still stops with an error that says so.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import logging
import os
import shutil
import tarfile
import time
import urllib.request
from pathlib import Path

from flax_transformer.errors import DataError


def is_wmt(builder) -> bool:
  from tensorflow_datasets.translate import wmt

  return isinstance(builder, wmt.WmtTranslate)


def archive_urls(builder) -> list[str]:
  """The URLs every split of `builder`'s config reads, in a stable order."""
  from tensorflow_datasets.translate import wmt

  source = builder.builder_config.language_pair[0]
  urls = []
  for subset in itertools.chain.from_iterable(builder.subsets.values()):
    dataset = wmt.DATASET_MAP[subset]
    if dataset.get_manual_dl_files(source):
      continue  # Files tfds itself asks the user to fetch by hand (CzEng, ...).
    urls += [u for u in dataset.get_url(source) if u not in urls]
  return urls


@functools.lru_cache(maxsize=1)
def _every_registered_url() -> dict:
  import tensorflow_datasets as tfds

  return tfds.core.download.checksums.get_all_url_infos()  # Reads every checksums file.


def registered_size(builder, url: str) -> int | None:
  """Bytes tfds registers for `url` (its checksums files), or None."""
  # The builder's own file first, then every registered file (tfds's download manager
  # checks against both: WMT14 FR-EN's UN and Giga archives are registered by WMT13's).
  info = (builder.url_infos or {}).get(url) or _every_registered_url().get(url)
  return info.size if info else None


def download_size(builder) -> int:
  """Bytes of every archive `builder` downloads, from tfds's registered sizes."""
  return sum(registered_size(builder, url) or 0 for url in archive_urls(builder))


def _fetch(url: str, target: Path, expected_size: int | None) -> None:
  partial = target.with_name(target.name + ".partial")
  logging.info("Downloading %s (%s)", url,
               f"{expected_size / 1e9:.2f} GB" if expected_size else "size unknown")
  start, done, last_log = time.time(), 0, 0.0
  try:
    with urllib.request.urlopen(url, timeout=120) as response, open(partial, "wb") as out:
      for block in iter(lambda: response.read(1 << 22), b""):
        out.write(block)
        done += len(block)
        if expected_size and time.time() - last_log > 30:
          last_log = time.time()
          rate = done / max(1e-9, last_log - start)
          logging.info("  %s: %.0f%%, %.1f MB/s, ETA %.0f s", target.name,
                       100 * done / expected_size, rate / 1e6, (expected_size - done) / rate)
  except OSError as e:
    raise DataError(f"cannot download {url} ({e}); without internet, put the file "
                    f"{target.name} in {target.parent} (config.manual_dir)") from None
  os.replace(partial, target)


def fetch_archives(builder, manual_dir: Path, download: bool) -> list[Path]:
  """Every archive of `builder` in `manual_dir`, downloading the missing ones."""
  paths = []
  for url in archive_urls(builder):
    path = manual_dir / url.rsplit("/", 1)[-1]
    if not path.is_file():
      if not download:
        raise DataError(f"{path}: missing, and downloading is off (fetch it from {url})")
      manual_dir.mkdir(parents=True, exist_ok=True)
      _fetch(url, path, registered_size(builder, url))
    paths.append(path)
  return paths


def extraction_dir(extract_dir: Path, archive: Path) -> Path:
  """Where tfds's download manager looks for an earlier extraction of `archive`."""
  import tensorflow_datasets as tfds

  method = tfds.download.Resource(path=os.fspath(archive)).extract_method
  return extract_dir / f"{method.name}.{archive.name}"


def extract_archives(archives: list[Path], extract_dir: Path) -> None:
  """Unpacks each tar archive (gzipped or not) once, as tfds's extractor would."""
  for archive in archives:
    target = extraction_dir(extract_dir, archive)
    if target.exists():
      continue
    start = time.time()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
      with tarfile.open(archive) as tar:
        tar.extractall(partial, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
      raise DataError(f"{archive}: cannot unpack ({e}); delete it to download it again") from None
    os.replace(partial, target)
    logging.info("Unpacked %s in %.1f s", archive.name, time.time() - start)


@contextlib.contextmanager
def in_memory_shuffle():
  """Lets tfds shuffle splits of up to half the host's memory without TensorFlow."""
  if importlib.util.find_spec("tensorflow") is not None:
    yield  # tfds spills to disk as it was written to.
    return
  from tensorflow_datasets.core import shuffle

  limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
  before = shuffle.MAX_MEM_BUFFER_SIZE
  shuffle.MAX_MEM_BUFFER_SIZE = max(before, limit)
  try:
    yield
  except ModuleNotFoundError as e:
    if e.name != "tensorflow":
      raise
    raise DataError(f"a split is larger than {limit / 1e9:.1f} GB (half this host's memory): "
                    "tfds then spills it to disk through TensorFlow; prepare on a host with "
                    "more memory, or install tensorflow-cpu for the preparation") from None
  finally:
    shuffle.MAX_MEM_BUFFER_SIZE = before


def prepare(builder, manual_dir: str = "", *, download: bool = True,
            register_checksums: bool = False) -> None:
  """Prepares a WMT builder as array_record from the statmt.org archives.

  manual_dir: folder of the archives under their download names (default
  `<data_dir>/downloads/manual`, tfds's own); missing ones are downloaded when
  `download`. register_checksums: record the archives' checksums in the builder's
  checksums file instead of checking them (tfds's option for changed sources).
  """
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core.download import download_manager

  downloads = Path(builder.data_dir_root) / "downloads"
  manual = Path(manual_dir) if manual_dir else downloads / "manual"
  extract_dir = downloads / "extracted"
  archives = fetch_archives(builder, manual, download)
  extract_archives(archives, extract_dir)
  try:
    with in_memory_shuffle():
      builder.download_and_prepare(
          file_format="array_record", download_dir=os.fspath(downloads),
          download_config=tfds.download.DownloadConfig(
              manual_dir=os.fspath(manual), extract_dir=os.fspath(extract_dir),
              register_checksums=register_checksums))
  except download_manager.NonMatchingChecksumError as e:
    first = str(e).splitlines()[0]
    raise DataError(f"{first} The file differs from the one tfds registers for its URL: "
                    f"delete it from {manual} to download it again.") from None
