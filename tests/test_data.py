"""Input pipeline: sources, vocabulary, packing, resuming, host sharding, eval batches."""

import gzip
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import textwrap

import collections

import grain
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import translation_info
from flax_transformer.data import pipeline as data
from flax_transformer.data import sources
from flax_transformer.data import token_cache
from flax_transformer.data import tokenizer
from flax_transformer.translation import batching


# --- Sources --------------------------------------------------------------------

def write(path, content: bytes):
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(content)
  return str(path)


def test_text_files_plain_and_gzip(tmp_path):
  src = write(tmp_path / "a.en", "Hello world\nSecond line\n".encode())
  tgt = write(tmp_path / "a.de.gz", "Hallo Welt\nZweite Zeile\n".encode())
  pairs = sources.read_parallel_files(src, tgt)
  assert len(pairs) == 2 and pairs[1] == ("Second line", "Zweite Zeile")


@pytest.mark.parametrize("src, tgt, message", [
    (b"a\nb\nc\n", b"x\ny\n", r"line counts differ: .*a\.en has 3 lines, .*b\.de has 2"),
    (b"", b"x\n", r"a\.en: file is empty"),
    (b"ok\nbad \xff\xfe here\n", b"x\ny\n", r"a\.en:2: invalid UTF-8 at byte 4"),
])
def test_bad_text_files_are_named(tmp_path, src, tgt, message):
  with pytest.raises(sources.DataError, match=message):
    sources.read_parallel_files(write(tmp_path / "a.en", src), write(tmp_path / "b.de", tgt))


def test_missing_file_and_split_are_named(tmp_path, multi30k_dir):
  with pytest.raises(sources.DataError, match="nothere.en: no such file"):
    sources.read_lines(tmp_path / "nothere.en")
  with pytest.raises(sources.DataError, match="multi30k has no split 'test2017'"):
    sources.multi30k("test2017", "en", "de", manual_dir=multi30k_dir)
  with pytest.raises(sources.DataError, match=r"train\.en\.gz: no such file"):
    sources.multi30k("train", "en", "de", manual_dir=str(tmp_path))


def test_multi30k_splits_from_local_folder(multi30k_dir):
  sizes = {split: len(sources.multi30k(split, "en", "fr", manual_dir=multi30k_dir))
           for split in sources.MULTI30K_SPLITS}
  assert sizes == {"train": 29000, "validation": 1014, "test_2016_flickr": 1000}


def test_multi30k_fetch_verifies_checksums(tmp_path, multi30k_dir):
  # The download path, served from a local URL (no internet here).
  template = "file://" + multi30k_dir + "/{file}"
  path = sources.fetch_multi30k_file("val.de.gz", tmp_path / "cache", template)
  assert path.read_bytes() == open(os.path.join(multi30k_dir, "val.de.gz"), "rb").read()
  bad = tmp_path / "bad"
  bad.mkdir()
  write(bad / "val.en.gz", b"tampered\n")
  with pytest.raises(sources.DataError, match="checksum mismatch"):
    sources.fetch_multi30k_file("val.en.gz", tmp_path / "cache2", "file://" + str(bad) + "/{file}")
  assert not (tmp_path / "cache2" / "val.en.gz").exists()


def test_readme_config_reads_a_local_copy_or_fetches_the_public_files(tmp_path, monkeypatch,
                                                                       multi30k_dir, caplog):
  """configs/multi30k.py as the README's command runs it: from a checkout beside a
  shared/data/multi30k it reads that copy, whatever the working directory; from one
  without it fetches the public files (here from a server on 127.0.0.1 standing in for
  the repository); the log says which. A --config.manual_dir the user names stays strict."""
  import runpy

  from conftest import ROOT, http_server

  served = []

  def respond(handler):
    served.append(handler.path)
    body = open(os.path.join(multi30k_dir, handler.path.rsplit("/", 1)[-1]), "rb").read()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)

  def checkout_config(checkout: str):  # configs/multi30k.py as a checkout there holds it.
    (tmp_path / checkout / "checkout" / "configs").mkdir(parents=True)
    copy = tmp_path / checkout / "checkout" / "configs" / "multi30k.py"
    copy.write_text((ROOT / "configs" / "multi30k.py").read_text())
    config = runpy.run_path(str(copy))["get_config"]()
    config.data_dir = str(tmp_path / "data")
    return config

  shared = tmp_path / "with" / "shared" / "data" / "multi30k"
  shared.mkdir(parents=True)
  for name in ("val.en.gz", "val.de.gz"):
    os.symlink(os.path.join(multi30k_dir, name), shared / name)
  monkeypatch.chdir(tmp_path)  # Neither checkout: the copy is found beside the config's.
  with http_server(respond) as url, caplog.at_level(logging.INFO):
    monkeypatch.setattr(sources, "MULTI30K_URL", url.replace("{file}", "raw/{file}"))
    local = sources.load_pairs(checkout_config("with"), "validation")
    assert served == [] and len(local) == 1014
    assert f"val.en.gz, val.de.gz read from the local copy {shared}" in caplog.text
    config = checkout_config("without")
    fetched = sources.load_pairs(config, "validation")
    assert served == ["/raw/val.en.gz", "/raw/val.de.gz"]
    assert list(fetched) == list(local)
    missing = tmp_path / "without" / "shared" / "data" / "multi30k"
    assert (f"val.en.gz, val.de.gz fetched from the public repository into "
            f"{tmp_path / 'data' / 'multi30k'} (no local copy in {missing})") in caplog.text
    config.manual_dir = str(tmp_path / "mine")
    with pytest.raises(sources.DataError, match=r"mine/val\.en\.gz: no such file"):
      sources.load_pairs(config, "validation")
  assert len(served) == 2


def test_the_tests_without_a_copy_beside_the_checkout_fetch_multi30k_or_fail(tmp_path,
                                                                             multi30k_dir):
  """conftest.find_multi30k (the multi30k_dir fixture's): no copy beside the checkout ->
  every file fetched into the cache (here from a server on 127.0.0.1), then read from
  there; a fetch that fails, or a MULTI30K_DIR that is missing, fails the test: no skip."""
  from conftest import find_multi30k, http_server

  def respond(handler):
    name = handler.path.rsplit("/", 1)[-1]
    body = open(os.path.join(multi30k_dir, name), "rb").read() if served is not None else b""
    if served is not None:
      served.append(name)  # Before the answer: the client may go on once it has it.
    handler.send_response(200 if served is not None else 404)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)

  served = []
  with http_server(respond) as url:
    found = find_multi30k(tmp_path / "none", tmp_path / "cache", url)
    assert found == str(tmp_path / "cache") and sorted(served) == sorted(sources.MULTI30K_SHA256)
    assert find_multi30k(tmp_path / "none", tmp_path / "cache", url) == found  # Fetched once.
    assert len(served) == len(sources.MULTI30K_SHA256)
    assert find_multi30k(tmp_path / "cache", tmp_path / "unused", url, strict=True) == found
    served = None  # The repository answers 404.
    with pytest.raises(pytest.fail.Exception, match=r"no copy at .*none, and fetching it"):
      find_multi30k(tmp_path / "none", tmp_path / "cache2", url)
  with pytest.raises(pytest.fail.Exception, match=r"Multi30k not found at .*none \(MULTI30K_DIR"):
    find_multi30k(tmp_path / "none", tmp_path / "cache", url, strict=True)


def test_tfds_translation_builder_prepared_as_array_record(tmp_path):
  """A translation builder like wmt14_translate, prepared and read without TensorFlow."""
  import tensorflow_datasets as tfds

  class TinyTranslate(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    _info = translation_info

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(20), "validation": self._generate_examples(3)}

    def _generate_examples(self, n):
      for i in range(n):
        yield i, {"en": f"sentence {i} ü", "de": f"Satz {i} ü"}

  TinyTranslate(data_dir=str(tmp_path)).download_and_prepare(file_format="array_record")
  pairs = sources.TfdsPairs("tiny_translate", "train", "en", "de", data_dir=str(tmp_path))
  assert len(pairs) == 20
  assert sorted(pairs[i] for i in range(20))[0] == ("sentence 0 ü", "Satz 0 ü")
  with pytest.raises(sources.DataError, match="has no split 'test'"):
    sources.TfdsPairs("tiny_translate", "test", "en", "de", data_dir=str(tmp_path))
  with pytest.raises(sources.DataError, match="has no language 'fr'"):
    sources.TfdsPairs("tiny_translate", "train", "en", "fr", data_dir=str(tmp_path))


# --- Vocabulary ------------------------------------------------------------------

def test_tokenizer_round_trip_on_validation(multi30k_tokenizer, multi30k_dir):
  tok = multi30k_tokenizer
  val = sources.multi30k("validation", "en", "de", manual_dir=multi30k_dir)
  for source, target in val:
    for text in (source, target):
      ids = tok.tokenize(text)
      assert ids[-1] == tokenizer.EOS_ID and (ids[:-1] > tokenizer.EOS_ID).all()
      # Normalisation: runs of ASCII spaces collapse, ends are stripped.
      assert tok.detokenize(ids) == re.sub(" +", " ", text.strip(" "))


def test_vocabulary_reused_and_other_hosts_wait(tmp_path, multi30k_tokenizer):
  path = tmp_path / "w" / "vocab.model"
  path.parent.mkdir()
  path.write_bytes(multi30k_tokenizer.path.read_bytes())
  never = lambda: (_ for _ in ()).throw(AssertionError("must not retrain"))  # noqa: E731
  tok = tokenizer.load_or_train_tokenizer(path, never, vocab_size=4000)
  assert tok.vocab_size == multi30k_tokenizer.vocab_size
  with pytest.raises(TimeoutError, match="process 1: no vocabulary"):
    tokenizer.load_or_train_tokenizer(tmp_path / "empty" / "vocab.model", never, vocab_size=4000,
                                      process_index=1, wait_timeout_s=0.5)


# --- Training batches -----------------------------------------------------------

@pytest.fixture(scope="module")
def multi30k_examples(multi30k_dir, multi30k_tokenizer):
  pairs = sources.multi30k("train", "en", "de", manual_dir=multi30k_dir)
  return data.pretokenized(pairs, data.TokenizePair(multi30k_tokenizer))


def test_packing_keeps_most_tokens(multi30k_examples):
  batching = data.TrainBatching(rows=48, max_source_length=64, max_target_length=64)
  it = iter(data.train_dataset(multi30k_examples, batching, seed=0))
  fractions = []
  for _ in range(20):
    batch = next(it)
    assert batch["inputs"].shape == (48, 64)
    fractions.append(data.nonpad_fraction(batch))
  print(f"non-pad fraction, packed Multi30k EN->DE 48x64: {np.mean(fractions):.3f}")
  assert np.mean(fractions) >= 0.90
  # Segments restart positions at 0 and targets end each segment with EOS.
  row_seg, row_tok = batch["targets_segmentation"][0], batch["targets"][0]
  for seg in set(row_seg[row_seg > 0].tolist()):
    where = np.nonzero(row_seg == seg)[0]
    assert (batch["targets_positions"][0][where] == np.arange(len(where))).all()
    assert row_tok[where[-1]] == tokenizer.EOS_ID


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_the_train_step_compiles_ahead_for_the_batches_the_pipeline_makes(multi30k_examples,
                                                                         packing):
  """train.py compiles the train step from `abstract_batch` before any data is read: a
  key, shape, dtype or sharding the real batches do not share would compile it twice."""
  import jax

  from flax_transformer.training import sharding as sharding_lib

  mesh = sharding_lib.make_mesh({"data": 2}, jax.devices()[:2])
  batch_sharding = sharding_lib.batch_sharding(mesh)
  batching = data.TrainBatching(rows=4, max_source_length=24, max_target_length=40,
                                packing=packing)
  placed = data.shard_host_rows(next(iter(data.train_dataset(multi30k_examples, batching,
                                                             seed=0))), batch_sharding)
  expected = batching.abstract_batch(1, batch_sharding)
  assert sorted(placed) == sorted(expected)
  for k, v in placed.items():
    assert (v.shape, v.dtype, v.sharding) == (expected[k].shape, expected[k].dtype,
                                              expected[k].sharding), k
  # Each process's rows are a share of the global batch the step compiles for.
  assert batching.abstract_batch(4, batch_sharding)["targets"].shape == (16, 40)


def test_tokenizing_after_the_shuffle_gives_the_same_stream(multi30k_dir, multi30k_tokenizer,
                                                            multi30k_examples):
  """Training tokenizes raw pairs inside the pipeline: without sampling, the batches
  are those of pre-tokenized examples, so runs stay comparable across versions."""
  pairs = sources.multi30k("train", "en", "de", manual_dir=multi30k_dir)
  batching = data.TrainBatching(rows=16, max_source_length=32, max_target_length=32)
  raw = iter(data.train_dataset(pairs, batching, seed=3,
                                tokenize=data.TokenizePair(multi30k_tokenizer)))
  pre = iter(data.train_dataset(multi30k_examples, batching, seed=3))
  # With sampling, segmentations differ every epoch: nothing is formed ahead.
  assert data.pretokenized(pairs, data.TokenizePair(multi30k_tokenizer, 0.1)) is None
  for _ in range(8):
    a, b = next(raw), next(pre)
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def test_sampled_segmentations_are_seeded_and_lossless(multi30k_dir, multi30k_tokenizer):
  texts = [s for s, _ in sources.multi30k("validation", "en", "de", manual_dir=multi30k_dir)][:60]
  first = multi30k_tokenizer.tokenize_sampled(texts, alpha=0.1, seed=7)
  multi30k_tokenizer.tokenize_sampled(texts, alpha=0.5, seed=99)  # Other draws in between.
  again = multi30k_tokenizer.tokenize_sampled(texts, alpha=0.1, seed=7)
  other = multi30k_tokenizer.tokenize_sampled(texts, alpha=0.1, seed=8)
  plain = [multi30k_tokenizer.tokenize(text) for text in texts]
  assert all((a == b).all() for a, b in zip(first, again))
  assert sum(len(a) != len(b) or (a != b).any() for a, b in zip(first, other)) >= 10
  for text, ids in zip(texts, first):
    assert ids[-1] == tokenizer.EOS_ID
    assert multi30k_tokenizer.detokenize(ids) == " ".join(text.split())
  # Dropped merges leave smaller pieces: more of them than the deterministic segmentation.
  assert np.mean([len(a) for a in first]) > 1.05 * np.mean([len(p) for p in plain])


def test_subword_sampling_per_epoch_is_deterministic_complete_and_resumable(
    multi30k_dir, multi30k_tokenizer):
  pairs = sources.multi30k("validation", "en", "de", manual_dir=multi30k_dir)
  pairs = [pairs[i] for i in range(41)]
  tokenize = data.TokenizePair(multi30k_tokenizer, sampling_alpha=0.1)
  batching = data.TrainBatching(rows=4, max_source_length=64, max_target_length=64,
                                packing=False)

  def stream(**kwargs):
    return data.train_dataset(pairs, batching, seed=1, tokenize=tokenize, **kwargs)

  targets = {}  # Source text -> the target ids of each epoch.
  for batch in stream(num_epochs=2):
    for source, target in zip(batch["inputs"], batch["targets"]):
      if source.any():
        text = multi30k_tokenizer.detokenize(source)
        targets.setdefault(text, []).append(tuple(target[target > 0].tolist()))
  references = {" ".join(s.split()): " ".join(t.split()) for s, t in pairs}
  assert sorted(targets) == sorted(references) and all(len(t) == 2 for t in targets.values())
  for source, (epoch1, epoch2) in targets.items():
    assert multi30k_tokenizer.detokenize(epoch1) == references[source]
    assert multi30k_tokenizer.detokenize(epoch2) == references[source]
  assert sum(a != b for a, b in targets.values()) >= 10  # Each epoch samples afresh.

  uninterrupted = [b["targets"] for b, _ in zip(stream(), range(30))]
  it = iter(stream())
  for _ in range(12):
    next(it)
  state = it.get_state()
  multi30k_tokenizer.tokenize_sampled(["Other draws in between."], alpha=0.3, seed=5)
  resumed = iter(stream())
  resumed.set_state(state)
  for expected in uninterrupted[12:]:
    np.testing.assert_array_equal(next(resumed)["targets"], expected)


def synthetic_examples(n: int) -> grain.MapDataset:
  """Example i: inputs [i + 3, EOS] (so ids identify examples), targets of varying length."""
  items = [{"inputs": np.array([i + 3, 1], np.int32),
            "targets": np.arange(3, 3 + 1 + i % 7, dtype=np.int32)} for i in range(n)]
  return grain.MapDataset.source(items)


def example_ids(batch) -> list[int]:
  ids = batch["inputs"][batch["inputs"] > 2] - 3
  return ids.tolist()


@pytest.mark.devices(8)
def test_two_hosts_eight_devices_see_every_example_once():
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  assert jax.device_count() == 8, "tests run with 8 simulated CPU devices"
  n = 203
  batching = data.TrainBatching(rows=8, max_source_length=8, max_target_length=8)
  seen = []
  mesh = Mesh(np.array(jax.devices()), ("data",))
  sharding = NamedSharding(mesh, PartitionSpec("data"))
  for host in range(2):
    for batch in data.train_dataset(synthetic_examples(n), batching, seed=3,
                                    process_index=host, process_count=2, num_epochs=1):
      seen.extend(example_ids(batch))
      placed = data.shard_host_rows(batch, sharding)
      assert placed["inputs"].sharding == sharding
      assert len(placed["inputs"].addressable_shards) == 8
      np.testing.assert_array_equal(np.asarray(placed["inputs"]), batch["inputs"])
  assert sorted(seen) == list(range(n))


RESUME_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, grain
    from flax_transformer.data import pipeline as data
    items = [{"inputs": np.array([i + 3, 1], np.int32),
              "targets": np.arange(3, 3 + 1 + i % 7, dtype=np.int32)} for i in range(97)]
    ds = data.train_dataset(grain.MapDataset.source(items),
                            data.TrainBatching(rows=4, max_source_length=8, max_target_length=8),
                            seed=5)
    it = iter(ds)
    mode, k = sys.argv[1], int(sys.argv[2])
    if mode == "save":
      for _ in range(k):
        next(it)
      print(json.dumps(it.get_state()))
    else:
      it.set_state(json.loads(sys.stdin.read()))
      print(json.dumps([next(it)["inputs"].tolist() for _ in range(k)]))
""")


def test_iterator_state_restored_in_a_fresh_process():
  run = lambda *args, stdin=None: subprocess.run(  # noqa: E731
      [sys.executable, "-c", RESUME_SCRIPT, *args], input=stdin, capture_output=True,
      text=True, check=True).stdout.strip().splitlines()[-1]
  state = run("save", "7")
  resumed = json.loads(run("load", "30", stdin=state))
  items = [{"inputs": np.array([i + 3, 1], np.int32),
            "targets": np.arange(3, 3 + 1 + i % 7, dtype=np.int32)} for i in range(97)]
  it = iter(data.train_dataset(grain.MapDataset.source(items),
                               data.TrainBatching(4, 8, 8), seed=5))
  uninterrupted = [next(it)["inputs"].tolist() for _ in range(37)]
  assert resumed == uninterrupted[7:]


def test_long_pairs_are_filtered_from_training_only():
  batching = data.TrainBatching(rows=4, max_source_length=8, max_target_length=4, packing=False)
  seen = [i for b in data.train_dataset(synthetic_examples(30), batching, seed=0, num_epochs=1)
          for i in example_ids(b)]
  # Example i has 1 + i % 7 target tokens: only those with <= 4 remain.
  assert sorted(seen) == [i for i in range(30) if 1 + i % 7 <= 4]


# --- Token cache ------------------------------------------------------------------

def assert_ids_equal(ids, pairs, tok):
  """Every pair's cached ids are those of tokenizing it now."""
  assert len(ids) == len(pairs)
  for i, (source, target) in enumerate(pairs):
    np.testing.assert_array_equal(ids[i]["inputs"], tok.tokenize(source))
    np.testing.assert_array_equal(ids[i]["targets"], tok.tokenize(target))


def test_token_cache_keeps_each_direction_apart(multi30k_dir, multi30k_tokenizer, tmp_path,
                                                monkeypatch):
  """One vocabulary, EN->DE then DE->EN through training_ids (the cache's threshold
  lowered): two caches, each equal to tokenizing on the fly."""
  from configs import multi30k as multi30k_config

  monkeypatch.setattr(data, "PRETOKENIZE_MAX_PAIRS", 100)
  tokenize = data.TokenizePair(multi30k_tokenizer)
  folders = {}
  for source_lang, target_lang in (("en", "de"), ("de", "en")):
    config = multi30k_config.get_config()
    config.manual_dir, config.token_cache_dir = multi30k_dir, str(tmp_path / "tokens")
    config.source_lang, config.target_lang = source_lang, target_lang
    config.train_split = "validation"  # 1,014 pairs: fast.
    pairs = sources.load_pairs(config, config.train_split)
    ids = data.training_ids(config, pairs, tokenize)
    assert isinstance(ids, token_cache.TokenizedPairs)
    assert_ids_equal(ids, pairs, multi30k_tokenizer)
    folders[source_lang] = ids
  assert len({ids.folder for ids in folders.values()}) == 2
  for source_lang, ids in folders.items():  # meta.json names the files, in their order.
    assert ids.meta["key"]["corpus"]["files"][0]["path"].endswith(f"val.{source_lang}.gz")


def test_token_cache_key_follows_the_files_and_is_checked(tmp_path, multi30k_tokenizer, caplog):
  src, tgt = tmp_path / "a.en", tmp_path / "a.de"
  write(src, b"A dog runs.\nTwo men talk.\n")
  write(tgt, b"Ein Hund rennt.\nZwei Manner reden.\n")
  first = token_cache.load_or_build(sources.read_parallel_files(src, tgt), multi30k_tokenizer,
                             tmp_path / "tokens")
  write(src, b"A cat sleeps.\nTwo women sing.\n")  # Same files, same count, new text.
  pairs = sources.read_parallel_files(src, tgt)
  with caplog.at_level(logging.INFO):
    second = token_cache.load_or_build(pairs, multi30k_tokenizer, tmp_path / "tokens")
  assert second.folder != first.folder
  # The stale cache stays (only the user knows no run needs it), but the log names it.
  assert "1 other token cache(s) of" in caplog.text and first.folder.name in caplog.text
  assert_ids_equal(second, pairs, multi30k_tokenizer)
  # A folder whose meta.json holds another key (a collision, a copied folder) is refused.
  with pytest.raises(sources.DataError, match=r"a\.de-2-.*: token cache of another corpus.*"
                     r"differs in corpus, sample_sha256"):
    token_cache.TokenizedPairs(first.folder, key=second.meta["key"])


def test_token_cache_pickles_as_its_folder(multi30k_dir, multi30k_tokenizer, tmp_path):
  """grain pickles the dataset for each input worker: the ids must not travel with it
  (each worker maps the files), whatever the corpus's size."""
  sizes = {}
  for split in ("validation", "train"):
    pairs = sources.multi30k(split, "en", "de", manual_dir=multi30k_dir)
    ids = token_cache.load_or_build(pairs, multi30k_tokenizer, tmp_path / "tokens")
    blob = pickle.dumps(ids)
    sizes[split] = len(blob)
    copy = pickle.loads(blob)
    assert len(copy) == len(ids) and copy.meta == ids.meta
    for i in (0, 1, len(ids) // 2, len(ids) - 1):
      for side in ("inputs", "targets"):
        np.testing.assert_array_equal(copy[i][side], ids[i][side])
  assert ids.meta["tokens"]["inputs"] > 300_000  # The training split's ids: over 600 KB.
  assert max(sizes.values()) < 1000 and abs(sizes["train"] - sizes["validation"]) < 20


@pytest.fixture(scope="module")
def sentence_pool(multi30k_dir):
  """Real sentences to draw corpora from: Multi30k validation's English and German."""
  pairs = sources.multi30k("validation", "en", "de", manual_dir=multi30k_dir)
  return [text for pair in pairs for text in pair]


def segments(batch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """Packed rows -> each pair's (input ids, target ids), through the segment ids, checking
  that positions restart at 0 in every segment."""
  out = []
  for row in range(batch["inputs"].shape[0]):
    pair = []
    for side in ("inputs", "targets"):
      seg, pos = batch[f"{side}_segmentation"][row], batch[f"{side}_positions"][row]
      pair.append({s: batch[side][row][seg == s] for s in set(seg[seg > 0].tolist())})
      for s in pair[-1]:
        assert (pos[seg == s] == np.arange((seg == s).sum())).all()
    assert pair[0].keys() == pair[1].keys()
    out += [(tuple(pair[0][s].tolist()), tuple(pair[1][s].tolist())) for s in sorted(pair[0])]
  return out


text = st.text(alphabet="abcxyz äöüß.,'-", max_size=40)


@settings(max_examples=10, deadline=None)
@given(choices=st.data(), rows=st.integers(1, 5), source_length=st.integers(3, 40),
       target_length=st.integers(3, 40), seed=st.integers(0, 2**16), k=st.integers(0, 5))
def test_pairs_to_ids_to_packed_batches_to_resumed_iterator(
    choices, rows, source_length, target_length, seed, k, multi30k_tokenizer, sentence_pool,
    tmp_path_factory):
  """The seams where data changes form, for random small corpora in both directions with
  one vocabulary: token cache ids = on-the-fly ids; the packed batches of both are equal;
  each pair that fits appears once an epoch and unpacks to its ids; an iterator restored
  after k batches goes on as the uninterrupted one."""
  tok = multi30k_tokenizer
  sentence = st.one_of(st.sampled_from(sentence_pool), text)
  forward = choices.draw(st.lists(st.tuples(sentence, sentence), min_size=1, max_size=30))
  cache_dir = tmp_path_factory.mktemp("tokens")
  batching = data.TrainBatching(rows=rows, max_source_length=source_length,
                                max_target_length=target_length)
  folders = {}
  for direction, pairs in (("forward", forward), ("backward", [(t, s) for s, t in forward])):
    pairs = sources.TextPairs([s for s, _ in pairs], [t for _, t in pairs])
    ids = token_cache.load_or_build(pairs, tok, cache_dir)
    folders[direction] = ids.folder
    assert_ids_equal(ids, pairs, tok)
    epoch = lambda examples, **kw: list(data.train_dataset(  # noqa: E731
        examples, batching, seed=seed, num_epochs=1, **kw))
    cached = epoch(ids)
    fly = epoch(pairs, tokenize=data.TokenizePair(tok))
    assert len(cached) == len(fly)
    for a, b in zip(cached, fly):
      assert a.keys() == b.keys() and all((a[key] == b[key]).all() for key in a)
    fits = [(tuple(ids[i]["inputs"].tolist()), tuple(ids[i]["targets"].tolist()))
            for i in range(len(ids))]
    fits = [p for p in fits if len(p[0]) <= source_length and len(p[1]) <= target_length]
    assert collections.Counter(p for b in cached for p in segments(b)) == \
        collections.Counter(fits)

    stream = lambda: iter(data.train_dataset(ids, batching, seed=seed))  # noqa: E731
    if not fits:
      continue  # Nothing to draw: an endless stream would never yield.
    uninterrupted = stream()
    expected = [next(uninterrupted) for _ in range(k + 3)]
    first = stream()
    for _ in range(k):
      next(first)
    resumed = stream()
    resumed.set_state(first.get_state())
    for want in expected[k:]:
      got = next(resumed)
      assert all((got[key] == want[key]).all() for key in want)
  assert (folders["forward"] == folders["backward"]) == all(s == t for s, t in forward)


# --- Eval batches ----------------------------------------------------------------

def test_eval_batches_keep_every_example_and_restore_order():
  rng = np.random.default_rng(0)
  examples = [(np.arange(1, rng.integers(2, 90)), np.arange(1, rng.integers(2, 40)))
              for _ in range(157)]
  examples.append((np.array([], np.int32), np.array([], np.int32)))  # An empty line.
  found = {}
  widths = set()
  for batch in batching.eval_batches(examples, batch_tokens=512, max_length=64, row_multiple=4):
    assert batch["inputs"].shape[0] % 4 == 0
    widths.add(batch["inputs"].shape[1])
    for row, i in enumerate(batch["index"]):
      if i >= 0:
        found[int(i)] = batch["inputs"][row]
  assert sorted(found) == list(range(len(examples)))
  assert widths <= {16, 32, 48, 64}
  for i, (source, _) in enumerate(examples):
    kept = source[:64]
    np.testing.assert_array_equal(found[i][:len(kept)], kept)


def test_a_width_with_less_than_a_batch_fits_its_examples_when_asked():
  """fit_small (translation of a user's text): a width whose examples fill less than one
  batch gets the rows they need, row_multiple times a power of two, not a batch of
  fillers (the first 64 sentences of test 2016 filled 468 rows); a width of several
  batches keeps whole ones, so no input compiles more shapes; every example once."""
  rng = np.random.default_rng(1)
  lengths = [int(n) for n in rng.integers(1, 17, 40)] + [20, 22, 25, 28, 30] + [40]
  examples = [(np.arange(1, n + 1), np.zeros(0, np.int32)) for n in lengths]
  whole = list(batching.eval_batches(examples, batch_tokens=512, max_length=64, row_multiple=2))
  fitted = list(batching.eval_batches(examples, batch_tokens=512, max_length=64, row_multiple=2,
                                      fit_small=True))
  for batches in (whole, fitted):
    index = np.concatenate([b["index"] for b in batches])
    assert sorted(index[index >= 0]) == list(range(len(examples)))
  # Width 16: 40 examples, two batches of 32 rows, kept; 32: 5 examples in 8 rows (2 x 4),
  # not 16; 48: 1 in 2 (one per device), not 10.
  assert [b["inputs"].shape for b in whole] == [(32, 16), (32, 16), (16, 32), (10, 48)]
  assert [b["inputs"].shape for b in fitted] == [(32, 16), (32, 16), (8, 32), (2, 48)]
  assert batching.fitted_rows(5, 256, 2) == 8 and batching.fitted_rows(1, 256, 2) == 2
  assert batching.fitted_rows(200, 256, 2) == 256 and batching.fitted_rows(3, 84, 1) == 4


def test_batch_size_modes():
  from configs import multi30k

  config = multi30k.get_config()
  tokens = data.train_batching(config, data_parallel_size=8)
  assert tokens.rows == 48 and tokens.rows % 8 == 0  # 3072 tokens / 64 per row.
  config.per_device_batch_size = 5
  fixed = data.train_batching(config, data_parallel_size=8, process_count=2)
  assert fixed.rows == 20  # 5 per device x 8 devices, split over 2 hosts.


def test_eval_widths_are_capped_and_every_length_fits():
  lengths = [3, 17, 20, 33, 40, 49, 60, 64, 70, 100]
  assert batching.bucket_widths(lengths, max_length=128) == [16, 32, 48, 64, 80, 112]
  capped = batching.bucket_widths(lengths, max_length=128, max_widths=3)
  assert len(capped) == 3 and capped[-1] == 112  # The widest always kept.
  examples = [(np.arange(1, n + 1), np.arange(1, 3)) for n in lengths * 5]
  shapes, seen = set(), 0
  for batch in batching.eval_batches(examples, batch_tokens=256, max_length=128, max_widths=3):
    shapes.add(batch["inputs"].shape)
    seen += int((batch["index"] >= 0).sum())
    for row, i in enumerate(batch["index"]):
      if i >= 0:  # Never truncated by the cap: a longer width holds it.
        np.testing.assert_array_equal(batch["inputs"][row, :len(examples[i][0])],
                                      examples[i][0])
  assert len(shapes) <= 3 and seen == len(examples)


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetched_batches_resume_exactly_from_a_checkpointed_state(multi30k_dir,
                                                                     multi30k_tokenizer,
                                                                     workers):
  """Batches run ahead of the consumer, yet the state is that of the batches handed out."""
  from absl import flags

  flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.
  pairs = sources.multi30k("validation", "en", "de", manual_dir=multi30k_dir)
  ids = data.pretokenized(pairs, data.TokenizePair(multi30k_tokenizer))
  batching = data.TrainBatching(rows=8, max_source_length=32, max_target_length=32)

  def stream():
    return iter(data.prefetched(data.train_dataset(ids, batching, seed=5),
                                lambda batch: {k: v + 0 for k, v in batch.items()},
                                workers=workers, host_buffer=4, device_buffer=2))

  first = stream()
  for _ in range(3):
    next(first)
  state = first.get_state()
  expected = [next(first) for _ in range(4)]
  resumed = stream()
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
