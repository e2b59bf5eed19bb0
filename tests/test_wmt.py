"""tfds's own wmt14_translate builders, prepared offline from archives laid out as
statmt.org's, read back, and trained on with configs/base.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flax_transformer.data import sources

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import wmt14_offline  # noqa: E402  (bench/: shared with bench/wmt_scale.py)

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
  batch for the tiny corpus: a step, then loss on the newstest2013 split."""
  data_dir, _, _ = wmt14
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/base.py"),
       f"--workdir={workdir}", f"--config.data_dir={data_dir}", "--config.vocab_size=400",
       "--config.batch_tokens=1024", "--config.max_source_length=64",
       "--config.max_target_length=64", "--config.num_train_steps=1",
       "--config.eval_every_steps=1", "--config.bleu_every_steps=0",
       "--config.log_every_steps=1", "--config.checkpoint_every_steps=1",
       "--config.eval_max_shapes=1"],  # One eval compile: the suite's time.
      env=dict(os.environ, XLA_FLAGS=""), capture_output=True, text=True, timeout=600)
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

  import wmt_corpus
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

  ids = token_cache.cached(pairs, tok, tmp_path / "tokens")
  assert len(ids) == len(pairs)
  rng = np.random.default_rng(0)
  for i in rng.choice(len(pairs), 500, replace=False).tolist() + [0, len(pairs) - 1]:
    source, target = pairs[i]
    np.testing.assert_array_equal(ids[i]["inputs"], tok.tokenize(source))
    np.testing.assert_array_equal(ids[i]["targets"], tok.tokenize(target))
  again = token_cache.cached(pairs, tok, tmp_path / "tokens")
  assert again.folder == ids.folder and again.meta == ids.meta  # Mapped, not rebuilt.
  other = tokenizer_lib.train_tokenizer(data.vocabulary_sentences(pairs, 5_000),
                                        tmp_path / "vocab2.model", vocab_size=1500)
  assert token_cache.cached(pairs, other, tmp_path / "tokens").folder != ids.folder

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
