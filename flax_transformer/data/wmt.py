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
import importlib
import importlib.util
import itertools
import logging
import os
import shutil
import tarfile
import time
from pathlib import Path

# Aliased: `download` is also prepare's and fetch_archives's flag (on or off).
from flax_transformer.data.download import download as download_url, partial_path
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


def fetch_archives(builder, manual_dir: Path, download: bool) -> list[Path]:
  """Every archive of `builder` in `manual_dir`, downloading the missing ones."""
  paths = []
  for url in archive_urls(builder):
    path = manual_dir / url.rsplit("/", 1)[-1]
    if not path.is_file():
      if not download:
        raise DataError(f"{path}: missing, and downloading is off (fetch it from {url})")
      manual_dir.mkdir(parents=True, exist_ok=True)
      size = registered_size(builder, url)
      logging.info("Downloading %s (%s)", url, f"{size / 1e9:.2f} GB" if size else "size unknown")
      download_url(url, path, expected_size=size, hint=f"without internet, put the file "
                   f"{path.name} in {path.parent} (config.manual_dir)")
    paths.append(path)
  return paths


def extraction_dir(extract_dir: Path, archive: Path) -> Path:
  """Where tfds's download manager looks for an earlier extraction of `archive`."""
  import tensorflow_datasets as tfds

  method = tfds.download.Resource(path=os.fspath(archive)).extract_method
  return extract_dir / f"{method.name}.{archive.name}"


def extract_archives(archives: list[Path], extract_dir: Path) -> None:
  """Unpacks each tar archive (gzipped or not) once, as tfds's extractor would.

  Each call unpacks into a folder of its own (`partial_path`) renamed at the end, so
  processes unpacking the same archive at once neither mix nor remove each other's
  files: the first rename wins, the others drop their copy.
  """
  for archive in archives:
    target = extraction_dir(extract_dir, archive)
    if target.exists():
      continue
    start = time.time()
    partial = partial_path(target)
    try:
      with tarfile.open(archive) as tar:
        extract_all(tar, partial)
    except (tarfile.TarError, OSError, EOFError) as e:
      shutil.rmtree(partial, ignore_errors=True)
      raise DataError(f"{archive}: cannot unpack ({e}); delete it to download it again") from None
    try:
      os.replace(partial, target)
    except OSError:
      if not target.is_dir():
        raise
      shutil.rmtree(partial, ignore_errors=True)  # Another process's extraction won.
    logging.info("Unpacked %s in %.1f s", archive.name, time.time() - start)


def extract_all(tar: tarfile.TarFile, folder: Path) -> None:
  """Every member of `tar` into `folder`, refusing (tarfile.TarError) any that would land
  or point outside it: tarfile's 'data' filter where Python has one (3.10.12 and later),
  the same checks here where it does not (absolute names, '..', links leaving the
  folder, devices)."""
  if hasattr(tarfile, "data_filter"):
    tar.extractall(folder, filter="data")
    return
  root = os.path.realpath(folder)

  def inside(path: str) -> bool:
    return os.path.commonpath([root, os.path.realpath(path)]) == root

  for member in tar.getmembers():
    where = os.path.join(root, member.name)
    if os.path.isabs(member.name) or not inside(where):
      raise tarfile.TarError(f"member {member.name!r} would be written outside {folder}")
    if member.issym() or member.islnk():
      base = os.path.dirname(where) if member.issym() else root
      if os.path.isabs(member.linkname) or not inside(os.path.join(base, member.linkname)):
        raise tarfile.TarError(f"link {member.name!r} -> {member.linkname!r} leaves {folder}")
    elif not (member.isfile() or member.isdir()):
      raise tarfile.TarError(f"member {member.name!r} is a device or pipe")
  tar.extractall(folder)


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
    file, line, function = _needed_tensorflow(e)
    if file == shuffle.__file__:
      raise DataError(f"a split is larger than {limit / 1e9:.1f} GB (half this host's memory): "
                      "tfds then spills it to disk through TensorFlow; prepare on a host with "
                      "more memory, or install tensorflow-cpu for the preparation") from None
    raise DataError(f"preparing the data needs TensorFlow, which is not installed ({function} "
                    f"at {file}:{line} imports it); install tensorflow-cpu") from None
  finally:
    shuffle.MAX_MEM_BUFFER_SIZE = before


def _needed_tensorflow(error: ModuleNotFoundError) -> tuple[str, int, str]:
  """(file, line, function) of the code that imported TensorFlow: the frame that entered
  the import machinery (importlib, or a lazy module whose attribute access imports)."""
  machinery = (os.path.dirname(importlib.__file__) + os.sep, "<frozen", "lazy_imports")
  needer, tb = None, error.__traceback__
  while tb is not None:
    code = tb.tb_frame.f_code
    if any(m in code.co_filename for m in machinery):
      break
    needer, tb = (code.co_filename, tb.tb_lineno, code.co_name), tb.tb_next
  return needer or ("?", 0, "?")


def prepare_from_archives(builder, manual_dir: str = "", *, download: bool = True,
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
