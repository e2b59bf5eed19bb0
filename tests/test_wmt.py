"""tfds's own wmt14_translate builders, prepared offline from archives laid out as
statmt.org's, read back, and trained on with configs/base.py."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import tarfile
import threading
import time
import types
import urllib.request
from pathlib import Path

import pytest

import conftest
from conftest import http_server, translation_info
from flax_transformer.data import sources
from flax_transformer.data import wmt
from tools import wmt14_offline, wmt_corpus

ROOT = Path(__file__).resolve().parents[1]

# Disjoint slices of Multi30k's line-aligned EN/DE/FR training files per subset.
SLICES = {"training-parallel-europarl-v7.tgz": (0, 300), "training-parallel-commoncrawl.tgz":
          (300, 450), "training-parallel-nc-v9.tgz": (450, 600), "training-parallel-un.tgz":
          (600, 700), "training-giga-fren.tar": (700, 800)}
NEWSTEST2013, NEWSTEST2014 = (800, 900), {"de": (900, 1000), "fr": (1000, 1060)}


@pytest.fixture(scope="module")
def wmt14(multi30k_dir, tmp_path_factory):
  """(data_dir, archives_dir, the lines written): both configs prepared from fake archives."""
  lines = {lang: sources.read_lines(f"{multi30k_dir}/train.{lang}.gz") for lang in ("en", "de", "fr")}
  lines["de"][3] += " <b>&amp; \"tags\" stay text</b>"  # Markup-like text survives as text.

  def pairs(xx, span):
    return list(zip(lines[xx][span[0]:span[1]], lines["en"][span[0]:span[1]]))

  train = {archive: {xx: pairs(xx, span) for xx in langs}
           for archive, (_, _, langs) in wmt14_offline.TRAIN_ARCHIVES.items()
           for span in [SLICES[archive]]}
  root = tmp_path_factory.mktemp("wmt14")
  wmt14_offline.write_archives(
      root / "archives", train, {lang: lines[lang][slice(*NEWSTEST2013)] for lang in lines},
      {xx: pairs(xx, span) for xx, span in NEWSTEST2014.items()})
  for config_name in ("de-en", "fr-en"):
    wmt14_offline.prepare(config_name, root / "data", root / "archives", root / "scratch")
  return root / "data", root / "archives", lines


@pytest.mark.parametrize("xx", ["de", "fr"])
def test_real_builder_reads_every_subset_offline(wmt14, xx):
  data_dir, _, lines = wmt14
  expected_train = {(lines["en"][i], lines[xx][i])
                    for archive in wmt14_offline.TRAIN_SUBSETS[xx]
                    for i in range(*SLICES[archive])}
  expected = {"train": expected_train,
              "validation": {(lines["en"][i], lines[xx][i]) for i in range(*NEWSTEST2013)},
              "test": {(lines["en"][i], lines[xx][i]) for i in range(*NEWSTEST2014[xx])}}
  for split, want in expected.items():
    got = sources.TfdsPairs(f"wmt14_translate/{xx}-en", split, "en", xx, data_dir=str(data_dir),
                            download=False)
    got = [got[i] for i in range(len(got))]
    assert len(got) == len(want), split  # No pair lost or duplicated...
    assert set(got) == want, split  # ...and each one whole, aligned, from its own archive.


def test_real_checksums_refuse_a_different_archive(wmt14, tmp_path):
  """The catalog builder (its registered checksums) sees that the archives are not
  statmt.org's, and the error names the file."""
  _, archives, _ = wmt14
  with pytest.raises(sources.DataError, match="training-parallel-europarl-v7.tgz.*wrong checksum"
                     ".*delete it"):
    sources.TfdsPairs("wmt14_translate/de-en", "train", "en", "de", data_dir=str(tmp_path),
                      manual_dir=str(archives))


def test_missing_archive_without_downloads_names_file_and_url(tmp_path):
  with pytest.raises(sources.DataError, match="training-parallel-europarl-v7.tgz: missing.*"
                     "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"):
    sources.TfdsPairs("wmt14_translate/de-en", "train", "en", "de", data_dir=str(tmp_path),
                      download=False)


def test_base_config_trains_and_evaluates_on_prepared_wmt14(wmt14, tmp_path):
  """configs/base.py as it is (base model, WMT14 EN->DE) with a smaller vocabulary and
  batch for the tiny corpus: a step, then loss on the newstest2013 split (one batch of 16
  pairs: a base model's forward pass over the whole split costs the suite half a minute)."""
  data_dir, _, _ = wmt14
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/base.py"),
       f"--workdir={workdir}", f"--config.data_dir={data_dir}", "--config.vocab_size=400",
       "--config.batch_tokens=256", "--config.max_source_length=64",
       "--config.max_target_length=64", "--config.num_train_steps=1",
       "--config.eval_every_steps=1", "--config.bleu_every_steps=0",
       "--config.log_every_steps=1", "--config.checkpoint_every_steps=1",
       "--config.eval_max_shapes=1",  # One eval compile: the suite's time.
       "--config.eval_batch_tokens=1024", "--config.num_eval_steps=1",
       f"--config.compilation_cache_dir={conftest.XLA_CACHE}"],
      env=conftest.cpu_env(), capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in records if "eval_loss" in r]
  assert [r["step"] for r in evals] == [1]
  assert evals[0]["eval_loss"] > 0
  run = json.loads((workdir / "run.json").read_text())
  assert run["launches"][-1]["config"]["dataset_name"] == "wmt14_translate/de-en"
  assert run["model"]["d_model"] == 512 and run["model"]["num_layers"] == 6


def test_50k_pairs_through_the_input_path(multi30k_dir, tmp_path):
  """bench/wmt_scale.py's path at 50k pairs: the WMT-shaped corpus prepared by the real
  builder, a vocabulary, the token cache (what corpora past 1M pairs use), and packed
  batches that equal those of tokenizing on the fly, resumed exactly."""
  import numpy as np

  from flax_transformer.data import pipeline as data
  from flax_transformer.data import token_cache
  from flax_transformer.data import tokenizer as tokenizer_lib

  train = wmt_corpus.write_subset_texts(multi30k_dir, 50_000, seed=0)
  dev = list(wmt_corpus.pairs(multi30k_dir, 300, seed=1))
  wmt14_offline.write_archives(
      tmp_path / "archives", {a: {"de": p} for a, p in train.items()},
      {"de": [d for d, _ in dev], "en": [e for _, e in dev]}, {"de": dev[:100]})
  wmt14_offline.prepare("de-en", tmp_path / "data", tmp_path / "archives", tmp_path / "scratch")
  pairs = sources.TfdsPairs("wmt14_translate/de-en", "train", "en", "de",
                            data_dir=str(tmp_path / "data"), download=False)
  assert len(pairs) == 50_000
  tok = tokenizer_lib.train_tokenizer(data.vocabulary_sentences(pairs, 10_000),
                                      tmp_path / "vocab.model", vocab_size=2000)

  ids = token_cache.load_or_build(pairs, tok, tmp_path / "tokens")
  assert len(ids) == len(pairs)
  rng = np.random.default_rng(0)
  for i in rng.choice(len(pairs), 500, replace=False).tolist() + [0, len(pairs) - 1]:
    source, target = pairs[i]
    np.testing.assert_array_equal(ids[i]["inputs"], tok.tokenize(source))
    np.testing.assert_array_equal(ids[i]["targets"], tok.tokenize(target))
  again = token_cache.load_or_build(pairs, tok, tmp_path / "tokens")
  assert again.folder == ids.folder and again.meta == ids.meta  # Mapped, not rebuilt.
  other = tokenizer_lib.train_tokenizer(data.vocabulary_sentences(pairs, 5_000),
                                        tmp_path / "vocab2.model", vocab_size=1500)
  assert token_cache.load_or_build(pairs, other, tmp_path / "tokens").folder != ids.folder

  batching = data.TrainBatching(rows=24, max_source_length=256, max_target_length=256)
  cached_stream = iter(data.train_dataset(ids, batching, seed=3))
  fly_stream = iter(data.train_dataset(pairs, batching, seed=3, tokenize=data.TokenizePair(tok)))
  batches = [next(cached_stream) for _ in range(6)]
  for batch in batches[:3]:
    expected = next(fly_stream)
    for key in batch:
      np.testing.assert_array_equal(batch[key], expected[key])
  assert np.mean([data.nonpad_fraction(b) for b in batches]) > 0.9

  resumed_from = iter(data.train_dataset(ids, batching, seed=3))
  for _ in range(5):
    next(resumed_from)
  resumed = iter(data.train_dataset(ids, batching, seed=3))
  resumed.set_state(resumed_from.get_state())
  for key, value in next(resumed).items():
    np.testing.assert_array_equal(value, batches[5][key])


def test_prepare_data_reports_the_prepared_splits(wmt14):
  data_dir, _, _ = wmt14
  result = subprocess.run(
      [sys.executable, str(ROOT / "prepare_data.py"), "--config", str(ROOT / "configs/base.py"),
       f"--config.data_dir={data_dir}"], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "wmt14_translate/de-en: prepared in" in result.stdout
  assert "train 600, validation 100, test 100" in result.stdout


# --- Downloads, unpacking, several processes -----------------------------------------

def run_together(*calls) -> list[BaseException]:
  """Runs each call in its own thread at once; the exceptions they raised."""
  errors = []

  def run(call):
    try:
      call()
    except BaseException as e:  # noqa: BLE001 (reported by the test)
      errors.append(e)

  threads = [threading.Thread(target=run, args=(call,)) for call in calls]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(60)
  return errors


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_download_cut_short_is_one_line_and_leaves_nothing(multi30k_dir, tmp_path, framing):
  """The server closes the connection after 1000 bytes: http.client raises IncompleteRead
  (no OSError) for a chunked body and simply ends a Content-Length one."""
  body = Path(multi30k_dir, "val.de.gz").read_bytes()

  def respond(handler):
    handler.send_response(200)
    if framing == "chunked":
      handler.send_header("Transfer-Encoding", "chunked")
      handler.end_headers()
      handler.wfile.write(b"%x\r\n" % len(body) + body[:1000])
    else:
      handler.send_header("Content-Length", str(len(body)))
      handler.end_headers()
      handler.wfile.write(body[:1000])

  with http_server(respond) as url:
    with pytest.raises(sources.DataError, match=r"cannot download http://127\.0\.0\.1:\d+/val\.de"
                       r"\.gz \((IncompleteRead|the connection ended after 1000 of \d+ bytes).*"
                       r"config\.manual_dir"):
      sources.fetch_multi30k_file("val.de.gz", tmp_path, url)
  assert os.listdir(tmp_path) == []  # No partial file left behind.


def test_missing_archives_are_downloaded_into_the_manual_dir(tmp_path):
  """The real wmt14_translate/de-en builder's statmt.org URLs, fetched through a local
  HTTP proxy (urllib's own proxy support): each archive lands whole in manual_dir, and
  one present already is not fetched again."""
  builder = sources.tfds_builder("wmt14_translate/de-en", str(tmp_path / "data"))
  urls = wmt.archive_urls(builder)
  body = lambda url: f"archive {url}\n".encode() * 1000  # noqa: E731
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / urls[0].rsplit("/", 1)[-1]).write_bytes(body(urls[0]))
  asked = []

  def respond(handler):
    asked.append(handler.path)  # A proxy is asked for the whole URL.
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body(handler.path))))
    handler.end_headers()
    handler.wfile.write(body(handler.path))

  with http_server(respond) as url:
    proxy = url.removesuffix("/{file}")
    urllib.request.install_opener(urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": proxy})))
    try:
      paths = wmt.fetch_archives(builder, manual, download=True)
    finally:
      urllib.request.install_opener(None)  # urlopen builds its default opener again.
  assert asked == urls[1:]
  assert paths == [manual / u.rsplit("/", 1)[-1] for u in urls]
  assert [p.read_bytes() for p in paths] == [body(u) for u in urls]
  assert sorted(os.listdir(manual)) == sorted(p.name for p in paths)  # No partial files.


def test_concurrent_downloads_of_one_file_do_not_clobber(multi30k_dir, tmp_path):
  """Two processes (here threads) fetch the same file into one folder at once: both
  succeed and the file is whole."""
  body = Path(multi30k_dir, "val.de.gz").read_bytes()
  both_asked = threading.Barrier(2, timeout=20)
  pauses = [1.0, 0.3]  # Both are writing their first half; one ends while the other writes.

  def respond(handler):
    both_asked.wait()
    pause = pauses.pop()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body[:len(body) // 2])
    handler.wfile.flush()
    time.sleep(pause)
    handler.wfile.write(body[len(body) // 2:])

  with http_server(respond) as url:
    fetch = lambda: sources.fetch_multi30k_file("val.de.gz", tmp_path, url)  # noqa: E731
    assert run_together(fetch, fetch) == []
  assert os.listdir(tmp_path) == ["val.de.gz"]
  assert (tmp_path / "val.de.gz").read_bytes() == body


def test_concurrent_extractions_of_one_archive_do_not_clobber(tmp_path):
  archive = tmp_path / "training-parallel-nc-v9.tgz"
  names = [f"nc/part{i // 100}/f{i}.txt" for i in range(1500)]
  with tarfile.open(archive, "w:gz") as tar:
    for name in names:
      data = (name * 20).encode()
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, __import__("io").BytesIO(data))
  extracted = tmp_path / "extracted"
  start = threading.Barrier(2, timeout=20)

  def extract():
    start.wait()
    wmt.extract_archives([archive], extracted)

  assert run_together(extract, extract) == []
  target = wmt.extraction_dir(extracted, archive)
  assert os.listdir(extracted) == [target.name]  # No partial folder left behind.
  found = sorted(str(p.relative_to(target)) for p in target.rglob("*.txt"))
  assert found == sorted(names)
  assert all((target / n).read_text() == n * 20 for n in names[::97])


@pytest.mark.parametrize("python_filter", [True, False], ids=["data_filter", "before_3.10.12"])
@pytest.mark.parametrize("member", ["../escaped.txt", "link"])
def test_an_archive_member_leaving_its_folder_is_refused(tmp_path, monkeypatch, python_filter,
                                                         member):
  if not python_filter:  # tarfile as on Python before 3.10.12: no filters, everything extracted.
    monkeypatch.delattr(tarfile, "data_filter")
    extractall = tarfile.TarFile.extractall
    monkeypatch.setattr(tarfile.TarFile, "extractall", lambda self, path=".", members=None, *,
                        numeric_owner=False: extractall(self, path, members,
                                                        numeric_owner=numeric_owner,
                                                        filter="fully_trusted"))
  archive = tmp_path / "evil.tgz"
  with tarfile.open(archive, "w:gz") as tar:
    info = tarfile.TarInfo(member)
    if member == "link":
      info.type, info.linkname = tarfile.SYMTYPE, "../../outside"
    else:
      info.size = 2
    tar.addfile(info, __import__("io").BytesIO(b"x\n") if info.size else None)
  extracted = tmp_path / "a" / "b"
  with pytest.raises(sources.DataError, match=rf"evil\.tgz: cannot unpack .*'?{member}'?.*"
                     "delete it"):
    wmt.extract_archives([archive], extracted)
  assert not (tmp_path / "a" / "escaped.txt").exists() and not (tmp_path / "a" / "link").exists()
  assert not list(extracted.iterdir()) if extracted.exists() else True


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None,
                    reason="with TensorFlow installed tfds spills to disk itself")
def test_only_the_shuffle_spill_is_reported_as_a_large_split(tmp_path):
  from tensorflow_datasets.core import shuffle

  with pytest.raises(sources.DataError, match=r"needs TensorFlow, which is not installed \("
                     r"test_only_the_shuffle.* at .*test_wmt\.py:\d+ imports it\)"):
    with wmt.in_memory_shuffle():
      import tensorflow  # noqa: F401  (any other code that needs TensorFlow)
  with pytest.raises(sources.DataError, match="a split is larger than .* spills it to disk"):
    with wmt.in_memory_shuffle():
      shuffle.MAX_MEM_BUFFER_SIZE = 100  # This split outgrows the in-memory limit.
      shuffler = shuffle.Shuffler(tmp_path, hash_salt="salt")
      for i in range(5):
        shuffler.add(i, b"x" * 50)


@pytest.fixture(scope="module")
def counted_builder():
  """A registered tfds translation builder ('prepare_once_translate') that records the
  data_dir of each preparation it runs."""
  import tensorflow_datasets as tfds

  prepared = []

  class PrepareOnceTranslate(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    _info = translation_info

    def _split_generators(self, dl_manager):
      prepared.append(os.fspath(self.data_dir_root))
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(4):
        yield i, {"en": f"sentence {i}", "de": f"Satz {i}"}

  return prepared


def test_only_process_0_prepares_while_the_others_wait(counted_builder, tmp_path):
  from configs import default

  def config(data_dir):
    config = default.get_config()
    config.dataset_name, config.eval_dataset_name = "prepare_once_translate", ""
    config.data_dir = str(data_dir)
    return config

  shared, local = tmp_path / "shared", tmp_path / "host1_local"
  # Process 1 alone: it waits for process 0 first, and prepares nothing before.
  nobody = threading.Barrier(2, timeout=0.5)
  with pytest.raises(threading.BrokenBarrierError):
    sources.prepare_datasets(config(shared), 1, 2, barrier=lambda name: nobody.wait())
  assert counted_builder == []

  lines = {}

  def process(index, data_dir, barrier):
    return lambda: lines.__setitem__(index, sources.prepare_datasets(
        config(data_dir), index, 2, barrier=lambda name: barrier.wait()))

  # One data_dir both see: process 0 prepares it, once; process 1 then finds it.
  both = threading.Barrier(2, timeout=60)
  assert run_together(process(1, shared, both), process(0, shared, both)) == []
  assert counted_builder == [str(shared)]
  assert lines[0] == lines[1] and "(train 4)" in lines[1][0]
  # Process 1's data_dir is its host's own and unprepared: it prepares its copy after the wait.
  both = threading.Barrier(2, timeout=60)
  assert run_together(process(1, local, both), process(0, shared, both)) == []
  assert counted_builder == [str(shared), str(local)]
  assert lines[1][0].startswith(f"prepare_once_translate: prepared in {local}")
  sources.prepare_datasets(config(local))  # One process: no barrier; nothing left to prepare.
  assert counted_builder == [str(shared), str(local)]


def _prepare_as_process(index: int, data_dir: str, log: str, start) -> list[str]:
  """Process `index` of 3 (process 0 on another host, passed the barrier already)
  preparing 'per_host_translate', whose preparation takes a second and logs its pid."""
  import tensorflow_datasets as tfds

  class PerHostTranslate(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    _info = translation_info

    def _split_generators(self, dl_manager):
      with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
      time.sleep(1)  # Long enough for the other process to look meanwhile.
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(4):
        yield i, {"en": f"sentence {i}", "de": f"Satz {i}"}

  config = types.SimpleNamespace(dataset_name="per_host_translate", eval_dataset_name="",
                                 data_dir=data_dir, manual_dir="")
  return sources.prepare_datasets(config, index, 3, barrier=lambda name: start.wait(60))


def test_processes_of_one_host_prepare_its_data_dir_once(tmp_path):
  """Processes 1 and 2 share a host and its local data_dir: both leave the barrier at
  once, one prepares, the other waits for it and finds the data prepared."""
  context = multiprocessing.get_context("spawn")  # No fork of a process running JAX.
  log = tmp_path / "preparations.log"
  with context.Manager() as manager, context.Pool(2) as pool:
    start = manager.Barrier(2)
    results = [pool.apply_async(_prepare_as_process, (i, str(tmp_path / "data"), str(log), start))
               for i in (1, 2)]
    lines = [r.get(timeout=120) for r in results]
  assert len(log.read_text().split()) == 1  # One preparation (one pid logged).
  assert lines[0] == lines[1] and "(train 4)" in lines[0][0]
