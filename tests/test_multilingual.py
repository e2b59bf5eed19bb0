"""One model, many languages (issue 76): each call names its direction, a batch may mix
targets, the target chosen as the workdir's languages record says (directions.py)."""

import json
from pathlib import Path

import pytest

from flax_transformer.languages import UnknownLanguageError
from flax_transformer.pretrained import importer
from flax_transformer.translation.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TEXTS = ["A dog runs in the park.", "Two men are talking.", "A girl rides a horse."]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory) -> Translator:
  """The tiny OPUS-MT model whose vocabulary has >>deu<< and >>fra<< (source_tag)."""
  workdir = tmp_path_factory.mktemp("tagged") / "run"
  importer.import_model(FIXTURES / "marian_swish_shared", workdir)
  return Translator.from_workdir(workdir)


def test_a_source_tag_target_is_the_tag_before_the_source(tagged):
  """target_lang='fra' translates (and scores) as the text with '>>fra<<' before it, which
  is how transformers' MarianTokenizer reads it (the fixture's references)."""
  references = json.loads((FIXTURES / "marian_swish_shared" / "references.json").read_text())
  tagged_texts = [t for t in references["sources"] if t.startswith(">>")][:4]
  targets = [t[2:t.index("<<")] for t in tagged_texts]
  bare = [t[t.index("<<") + 3:] for t in tagged_texts]
  want = tagged.translate(tagged_texts)
  assert tagged.translate(bare, target_lang=targets) == want
  assert tagged.score(bare, want, target_lang=targets) == tagged.score(tagged_texts, want)


def test_a_batch_mixing_targets_equals_each_target_alone(tagged):
  mixed = tagged.translate_nbest(TEXTS, target_lang=["fra", "deu", "fra"])
  alone = {code: tagged.translate_nbest(TEXTS, target_lang=code) for code in ("fra", "deu")}
  assert mixed == [alone["fra"][0], alone["deu"][1], alone["fra"][2]]
  assert alone["fra"] != alone["deu"]


def test_a_target_the_model_does_not_know_is_one_line_naming_those_it_does(tagged):
  with pytest.raises(UnknownLanguageError, match=r"^the model does not translate into 'it': "
                     r"it knows en -> deu, fra$"):
    tagged.translate(TEXTS, target_lang="it")
  with pytest.raises(UnknownLanguageError, match=r"^the model does not translate from 'de'"):
    tagged.translate(TEXTS, source_lang="de", target_lang="fra")
