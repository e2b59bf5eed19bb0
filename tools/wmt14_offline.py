"""tfds's own WMT14 builder, run offline on archives laid out as statmt.org's.

Used by tests/test_wmt.py (a few hundred pairs) and bench/wmt_scale.py (4.5M).

`write_archives` writes the archives `wmt14_translate/de-en` and `/fr-en` download,
under their download names, member paths and formats (TRAIN_ARCHIVES; dev.tgz:
newstest2013 as text, newstest2014 as SGML).

tfds checks each archive against the checksums registered for its URL, which these
small archives fail. Its documented remedy is to register their checksums, which
writes the builder's checksums file; the installed one lives inside the tfds package,
so `offline_builder` subclasses tfds's `Wmt14Translate` unchanged in a scratch folder,
whose checksums.tsv takes them. All preparation code is tfds's own, and the data is
written as `wmt14_translate`, where `tfds.data_source("wmt14_translate/de-en")` reads it.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import sys
import tarfile
from pathlib import Path
from typing import Sequence

Pairs = Sequence[tuple[str, str]]  # (xx sentence, en sentence)

TRAIN_ARCHIVES = {
    # archive: (member template for the xx side, for the en side, languages in it)
    "training-parallel-europarl-v7.tgz": (
        "training/europarl-v7.{xx}-en.{xx}", "training/europarl-v7.{xx}-en.en", ("de", "fr")),
    "training-parallel-commoncrawl.tgz": (
        "commoncrawl.{xx}-en.{xx}", "commoncrawl.{xx}-en.en", ("de", "fr")),
    "training-parallel-nc-v9.tgz": (
        "training/news-commentary-v9.{xx}-en.{xx}", "training/news-commentary-v9.{xx}-en.en",
        ("de", "fr")),
    "training-parallel-un.tgz": ("un/undoc.2000.{xx}-en.{xx}", "un/undoc.2000.{xx}-en.en",
                                 ("fr",)),
    "training-giga-fren.tar": ("giga-fren.release2.fixed.{xx}.gz",
                               "giga-fren.release2.fixed.en.gz", ("fr",)),
}
TRAIN_SUBSETS = {"de": ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz",
                        "training-parallel-nc-v9.tgz"),
                 "fr": tuple(TRAIN_ARCHIVES)}


def _lines(sentences: Sequence[str]) -> bytes:
  return "".join(s + "\n" for s in sentences).encode("utf-8")


def _sgm(kind: str, lang: str, sentences: Sequence[str]) -> bytes:
  """newstest2014-style SGML: one document of one <seg> a line."""
  if kind == "src":
    head = '<srcset setid="newstest2014" srclang="any">'
    doc = '<doc docid="1012-bbc" genre="news" origlang="en">'
  else:
    head = f'<refset setid="newstest2014" srclang="any" trglang="{lang}">'
    doc = '<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">'
  body = [f'<seg id="{i}">{s}</seg>' for i, s in enumerate(sentences, start=1)]
  end = "</srcset>" if kind == "src" else "</refset>"
  return "\n".join([head, doc, "<p>"] + body + ["</p>", "</doc>", end, ""]).encode("utf-8")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size, info.mtime, info.mode = len(data), 1_400_000_000, 0o644
  tar.addfile(info, io.BytesIO(data))


def _open(path: Path) -> tarfile.TarFile:
  # Fixed mtime in the gzip header too, so the same pairs give the same bytes.
  if path.suffix == ".tgz":
    raw = gzip.GzipFile(path, "wb", compresslevel=1, mtime=0)
    return tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT)
  return tarfile.open(path, "w", format=tarfile.GNU_FORMAT)


def write_archives(out_dir: str | Path, train: dict[str, dict[str, Pairs]],
                   newstest2013: dict[str, Sequence[str]],
                   newstest2014: dict[str, Pairs]) -> list[Path]:
  """Writes the archives of `TRAIN_ARCHIVES` and dev.tgz into `out_dir`.

  train: {archive name: {xx: [(xx, en), ...]}} (archives or languages left out get
  one placeholder pair, so that every member the builder opens exists);
  newstest2013: {language: sentences}, one line-aligned list per language, English
  included (like the real set, one text a language shared by every pair);
  newstest2014: {xx: pairs} (one SGML source and reference per pair, as the real).
  Returns the paths written.
  """
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  for archive, (xx_member, en_member, langs) in TRAIN_ARCHIVES.items():
    path = out_dir / archive
    tar = _open(path)
    for xx in langs:
      pairs = train.get(archive, {}).get(xx) or [("x", "x")]
      xx_bytes, en_bytes = _lines([p[0] for p in pairs]), _lines([p[1] for p in pairs])
      if archive.endswith(".tar"):  # giga-fren: gzipped text files inside a plain tar.
        xx_bytes, en_bytes = gzip.compress(xx_bytes, mtime=0), gzip.compress(en_bytes, mtime=0)
      _add(tar, xx_member.format(xx=xx), xx_bytes)
      _add(tar, en_member.format(xx=xx), en_bytes)
      if "commoncrawl" in archive:  # The real archive has these; the builder ignores them.
        _add(tar, f"commoncrawl.{xx}-en.annotation", _lines(["wmt"] * len(pairs)))
    tar.close()
    if isinstance(tar.fileobj, gzip.GzipFile):
      tar.fileobj.close()
    written.append(path)
  path = out_dir / "dev.tgz"
  tar = _open(path)
  for lang, sentences in sorted(newstest2013.items()):
    _add(tar, f"dev/newstest2013.{lang}", _lines(sentences))
  for xx, pairs in sorted(newstest2014.items()):
    _add(tar, f"dev/newstest2014-{xx}en-src.{xx}.sgm", _sgm("src", xx, [p[0] for p in pairs]))
    _add(tar, f"dev/newstest2014-{xx}en-ref.en.sgm", _sgm("ref", "en", [p[1] for p in pairs]))
  tar.close()
  tar.fileobj.close()
  written.append(path)
  return written


_BUILDER_MODULE = '''\
"""tfds's Wmt14Translate, unchanged, living here so its checksums.tsv is this folder's."""
from tensorflow_datasets.translate import wmt14


class Wmt14Translate(wmt14.Wmt14Translate, skip_registration=True):
  name = "wmt14_translate"
'''


def offline_builder(scratch: str | Path):
  """tfds's `Wmt14Translate` class whose checksums file is `scratch`/checksums.tsv."""
  scratch = Path(scratch)
  scratch.mkdir(parents=True, exist_ok=True)
  module_path = scratch / "wmt14_offline_builder.py"
  module_path.write_text(_BUILDER_MODULE)
  spec = importlib.util.spec_from_file_location("wmt14_offline_builder", module_path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module.Wmt14Translate


def prepare(config_name: str, data_dir: str | Path, archives_dir: str | Path,
            scratch: str | Path) -> None:
  """Prepares `wmt14_translate/<config_name>` as array_record from `archives_dir`.

  No network: every archive is in the manual folder under its download name. The
  same code path as a user's (`flax_transformer.data.wmt.prepare_from_archives`), with the
  archives' checksums registered on the way.
  """
  from flax_transformer.data import wmt

  builder = offline_builder(scratch)(config=config_name, data_dir=str(data_dir),
                                     file_format="array_record")
  wmt.prepare_from_archives(builder, str(archives_dir), download=False, register_checksums=True)
