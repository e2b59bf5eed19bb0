"""export.py --format=transformers of a model trained here on en, de and fr, against
transformers itself: tests/fixtures/multilingual_export is such an export (of a tiny run,
by tests/fixtures/make_multilingual_export.py), with what transformers' MarianMTModel
computes with it, each target's prefix ('▁', '<2de>') given to generate as
decoder_input_ids (references.json: ids, scores, greedy outputs, per direction).
import_model.py of the folder must translate each direction as transformers did, and
export.py of that import must write the folder again."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from flax_transformer.languages import Languages
from flax_transformer.pretrained import importer
from flax_transformer.translation import directions
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator
from test_export_transformers import export

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "fixtures" / "multilingual_export"
REFERENCES = json.loads((FOLDER / "references.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
  workdir = tmp_path_factory.mktemp("multilingual_export") / "run"
  importer.import_model(FOLDER, workdir)
  return workdir


def test_the_import_states_the_languages_the_export_recorded(imported):
  """Before: the importer read only >>xx<< tags and tokenizer_config.json's pair, so a
  multilingual export came back stating no languages, and --target_lang was refused."""
  record = json.loads((imported / "run.json").read_text())["languages"]
  assert Languages.from_json(record) == Languages.trained(("en", "de", "fr"))
  assert record == json.loads((FOLDER / "manifest.json").read_text())["languages"]


@pytest.mark.parametrize("direction", sorted(REFERENCES["directions"]))
def test_each_direction_translates_and_scores_as_transformers(imported, direction):
  """The ids (the prefix first in the target's: '▁', '<2de>' as MarianTokenizer cuts
  '<2de>'), the summed log-probabilities within 1e-4 and the greedy outputs of the
  folder under transformers, equal decode.py's on the import with --source_lang and
  --target_lang."""
  ref = REFERENCES["directions"][direction]
  translator = Translator.from_workdir(
      imported, search=SearchConfig(beam_size=1, max_extra=REFERENCES["max_extra"]),
      devices=jax.devices()[:1])
  theirs = json.loads((FOLDER / "vocab.json").read_text(encoding="utf-8"))
  ours = {piece: i for piece, i in zip(
      translator.tokenizer.target.pieces(range(len(theirs))), range(len(theirs)))}
  to_ours = {i: ours[piece] for piece, i in theirs.items()}  # Marian's ids -> ours.
  lang = dict(source_lang=ref["source_lang"], target_lang=ref["target_lang"])
  token = translator.languages.target_token(ref["target_lang"])
  forced = directions.forced_ids(translator.tokenizer.target, token, ref["target_lang"])
  assert forced.tolist() == [to_ours[i] for i in ref["prefix"]]
  for source, target, source_ids, target_ids in zip(ref["sources"], ref["targets"],
                                                    ref["source_ids"], ref["target_ids"]):
    assert translator.tokenizer.source.tokenize(source).tolist() == [
        to_ours[i] for i in source_ids]
    assert forced.tolist() + translator.tokenizer.target.tokenize(target).tolist() == [
        to_ours[i] for i in target_ids]
  scores = [s for s, _ in translator.score(ref["sources"], ref["targets"], **lang)]
  np.testing.assert_allclose(scores, ref["log_probs"], atol=1e-4, rtol=0)
  assert translator.translate(ref["sources"], **lang) == ref["greedy_text"]


def test_the_import_exports_back_to_the_same_folder(imported, tmp_path):
  """export.py of the import writes transformers' folder again: the same tensors, files
  and languages record (so what transformers was checked on is what export.py writes)."""
  done = export(imported, tmp_path / "hf", "--beam_size=1")
  assert done.returncode == 0, done.stderr[-3000:]
  original, again = (load_file(str(f / "model.safetensors")) for f in (FOLDER, tmp_path / "hf"))
  assert sorted(again) == sorted(original)
  for key in original:
    np.testing.assert_array_equal(again[key], original[key], err_msg=key)
  for name in ("config.json", "generation_config.json", "tokenizer_config.json",
               "vocab.json"):
    assert json.loads((tmp_path / "hf" / name).read_text()) == json.loads(
        (FOLDER / name).read_text()), name
  for name in ("source.spm", "target.spm"):
    assert (tmp_path / "hf" / name).read_bytes() == (FOLDER / name).read_bytes(), name
  manifest = json.loads((tmp_path / "hf" / "manifest.json").read_text())
  assert manifest["languages"] == json.loads((FOLDER / "manifest.json").read_text())["languages"]


def test_a_manifest_json_that_is_not_json_is_another_tools_and_left_unread(tmp_path):
  """A transformers folder (here OPUS-MT's, its targets >>deu<< and >>fra<<) may hold
  another tool's manifest.json: one that is not JSON is no export.py record, and the
  folder imports with the languages its own files state. Before: import_model.py refused
  the folder ('manifest.json: not JSON'), which it imported before the record was read."""
  folder = tmp_path / "opus"
  shutil.copytree(ROOT / "tests" / "fixtures" / "marian_swish_shared", folder)
  (folder / "manifest.json").write_text("name: a dataset card\nfiles: [config.json]\n")
  importer.import_model(folder, tmp_path / "run")
  record = Languages.from_json(json.loads((tmp_path / "run" / "run.json").read_text())[
      "languages"])
  assert (record.targets, record.target_by) == (("deu", "fra"), "source_tag")
