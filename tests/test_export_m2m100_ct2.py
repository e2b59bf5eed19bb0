"""export.py --format=ctranslate2 of an imported M2M100 / NLLB-200 workdir: CTranslate2's
Translator (CPU), the target language forced by its target_prefix, gives the greedy
outputs of our Translator (identical ids) into two targets. (CTranslate2's own converter
of the source folder agrees with this export too: tests/fixtures/check_m2m100_ct2.py, with
torch; results/bench/export_m2m100_ct2.json.)"""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import ctranslate2  # The test extra's: no skip where it is missing.
import jax
import pytest

from conftest import cpu_env
from flax_transformer.pretrained import importer
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
MAX_EXTRA = 20


def export(workdir, out, *flags):
  return subprocess.run([sys.executable, str(ROOT / "export.py"), f"--workdir={workdir}",
                         f"--out={out}", "--format=ctranslate2", *flags],
                        capture_output=True, text=True, env=cpu_env(), cwd=ROOT)


def ct2_greedy(folder, sources: list[list[str]], target: str, limits: list[int]):
  """CTranslate2's greedy search of piece sequences, `target` forced first: each output
  up to its limit (tokens before the EOS our search forces there; the prefix counts)."""
  model = ctranslate2.Translator(str(folder), device="cpu")
  out = []
  for pieces, limit in zip(sources, limits):  # One call per limit: one sentence each.
    result = model.translate_batch([pieces], target_prefix=[[target]], beam_size=1,
                                   max_decoding_length=limit, suppress_sequences=[["<pad>"]])
    out.append(result[0].hypotheses[0])
  return out


@pytest.mark.parametrize("name", ["m2m100", "nllb"])
def test_ctranslate2_greedy_with_target_prefix_equals_ours(name, multi30k_dir, tmp_path):
  importer.import_model(FIXTURES / name, tmp_path / "run")
  done = export(tmp_path / "run", tmp_path / "ct2")
  assert done.returncode == 0, done.stderr[-2000:]
  out = tmp_path / "ct2"
  manifest = json.loads((out / "manifest.json").read_text())
  languages = manifest["languages"]
  assert manifest["tokenizer"]["kind"] == "m2m100" and languages["target_by"] == "decoder_prefix"
  # The import's padding rows (to a multiple of 128) are not in CTranslate2's vocabulary.
  rows = json.loads((FIXTURES / name / "config.json").read_text())["vocab_size"]
  vocabulary = json.loads((out / "shared_vocabulary.json").read_text())
  assert len(vocabulary) == rows
  assert (out / "sentencepiece.bpe.model").read_bytes() == (
      FIXTURES / name / "sentencepiece.bpe.model").read_bytes()

  ours = Translator.from_workdir(tmp_path / "run", search=SearchConfig(
      beam_size=1, max_extra=MAX_EXTRA), devices=jax.devices()[:1])
  with gzip.open(Path(multi30k_dir) / "val.en.gz", "rt", encoding="utf-8") as f:
    lines = [next(f).rstrip("\n") for _ in range(30)]
  codes = {c: ours.languages.model_code(c) for c in ("en", "de", "fr")}
  # Our tokenizer's source ids (the source's language token placed as the model's
  # tokenizer places it, EOS last) as pieces: what CTranslate2 reads.
  tokenizer = ours.tokenizer.source
  source_ids = [tokenizer.tokenize(f"{languages['source_tokens'][codes['en']]} {line}")
                for line in lines]
  limits = [min(len(ids) + MAX_EXTRA, ours.member(0)[0].max_len) - 1
            for ids in source_ids]
  for target in ("de", "fr"):
    token = languages["target_tokens"][codes[target]]
    forced = [tokenizer.tokenize(token)[:1]] * len(lines)
    assert ours.tokenizer.target.pieces(forced[0]) == [token]
    expected = [h[0][0] for h in ours.translate_nbest_ids(source_ids, prefixes=forced)]
    theirs = ct2_greedy(out, [tokenizer.pieces(ids) for ids in source_ids], token, limits)
    assert [ours.tokenizer.target.pieces(ids) for ids in expected] == theirs
    assert len({tuple(t) for t in theirs}) > 10  # Sentences told apart: equality means much.


def test_without_ctranslate2_one_line_before_the_model_is_loaded(tmp_path):
  """Where ctranslate2 is not installed (hidden from the script here), the install line
  comes before the workdir's model is read (an NLLB-3.3B's 13 GB), not after; --out
  untouched."""
  importer.import_model(FIXTURES / "nllb", tmp_path / "run")
  hide = ("import runpy, sys; sys.modules['ctranslate2'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_path(sys.argv[0], run_name='__main__')")
  done = subprocess.run([sys.executable, "-c", hide, str(ROOT / "export.py"),
                         f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'ct2'}",
                         "--format=ctranslate2"],
                        capture_output=True, text=True, env=cpu_env(), cwd=ROOT)
  assert done.returncode == 2, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1] == (
      "error: CTranslate2 is not installed: pip install -e '.[ctranslate2]'")
  assert "Loaded" not in done.stderr and not (tmp_path / "ct2").exists()
