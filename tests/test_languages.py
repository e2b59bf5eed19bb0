"""A workdir knows its languages (flax_transformer/languages.py, run.json's "languages"):
what trained runs, OPUS-MT and FSMT imports record, what older workdirs are read as, and
the one line a pair the model does not know gets."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from flax_transformer import languages, workdir
from flax_transformer.errors import DataError
from flax_transformer.languages import Languages, UnknownLanguageError
from flax_transformer.pretrained import importer, marian

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def test_the_record_round_trips_and_a_bad_one_is_one_line():
  three = Languages.trained(["en", "de", "fr"])
  assert Languages.from_json(json.loads(json.dumps(three.to_json()))) == three
  assert three.to_json()["target_tokens"] == {"en": "<2en>", "de": "<2de>", "fr": "<2fr>"}
  assert len(three.pairs()) == 6 and ("en", "en") not in three.pairs()
  for bad, named in (({"sources": "en"}, "languages.sources='en'"),
                     ({"targets": ["de", "fr"]}, "target_by='none' with 2 targets"),
                     ({"targets": ["de"], "target_by": "tag"}, "target_by='tag'"),
                     ({"targets": ["de", "fr"], "target_by": "source_tag",
                       "target_tokens": {"de": ">>de<<"}}, "['fr'] have no target_tokens"),
                     ({"target": ["de"]}, "unknown keys ['target']")):
    with pytest.raises(DataError, match=r"^run.json: languages") as error:
      Languages.from_json(bad)
    assert named in str(error.value) and "\n" not in str(error.value)


def test_a_pair_the_model_does_not_know_names_the_ones_it_does():
  three = Languages.trained(["en", "de", "fr"])
  assert three.check_pair("en", "fr") == ("en", "fr")
  known = "it knows en -> de, fr; de -> en, fr; fr -> en, de"
  for source, target, start in (("en", "it", "the model does not translate into 'it'"),
                                ("it", "de", "the model does not translate from 'it'"),
                                ("de", "de", "the model does not translate from 'de' into"),
                                ("en", None, "name a target language")):
    with pytest.raises(UnknownLanguageError) as error:
      three.check_pair(source, target)
    assert str(error.value).startswith(start) and str(error.value).endswith(known)
  one = Languages.one_pair("en", "de")
  assert one.check_pair(None, None) == ("en", "de") and one.target_token("de") is None
  with pytest.raises(UnknownLanguageError, match="^the model does not translate from 'fr': "
                     "it knows en -> de$"):
    one.check_pair("fr", "de")


def test_a_many_language_model_names_each_language_once():
  """NLLB-200 translates each of its 202 languages into each other one: the line names
  the languages once each, not the 202 x 201 pairs (a 408 KB line from decode.py, a
  193 KB 400 from serve.py before)."""
  codes = ("eng_Latn", "deu_Latn", "fra_Latn", "ces_Latn", "zho_Hans")
  five = Languages(sources=codes, targets=codes, target_by="decoder_prefix",
                   target_tokens={c: c for c in codes}, source_tokens={c: c for c in codes})
  with pytest.raises(UnknownLanguageError) as error:
    five.check_pair("eng_Latn", "xx")
  assert str(error.value) == ("the model does not translate into 'xx': it translates between "
                              "any two of its 5 languages: eng_Latn, deu_Latn, fra_Latn, "
                              "ces_Latn, zho_Hans")
  from flax_transformer.serving.language_api import LanguageApi
  assert LanguageApi(five).known() == "between any two of en, de, fr, cs, zh"
  both = Languages(sources=("eng_Latn", "zho_Hans", "zho_Hant"),
                   targets=("eng_Latn", "zho_Hans", "zho_Hant"), target_by="decoder_prefix",
                   target_tokens={c: c for c in ("eng_Latn", "zho_Hans", "zho_Hant")})
  assert [(e["code"], e["name"]) for e in LanguageApi(both).listing()] == [
      ("en", "English"), ("zh", "Chinese (Simplified)"), ("zh-Hant", "Chinese (Traditional)")]
  assert LanguageApi(five).listing()[4]["name"] == "Chinese"  # One script: no need to say.
  many = [f"x{i:03d}_Latn" for i in range(202)]
  nllb = Languages(sources=tuple(many), targets=tuple(many), target_by="decoder_prefix",
                   target_tokens={c: c for c in many})
  with pytest.raises(UnknownLanguageError) as error:
    nllb.check_pair(None, "xx")
  assert len(str(error.value)) < 202 * 12 and all(c in str(error.value) for c in many)


def test_a_workdir_without_the_record_is_read_from_its_one_pair(trained_tiny, tmp_path):
  """trained_tiny's run.json holds the record; the same record without it (a workdir
  written before) is read as the same pair, as are an FSMT import's langs."""
  record = json.loads((Path(trained_tiny) / "run.json").read_text())
  assert Languages.from_json(record["languages"]) == Languages.one_pair("en", "de")
  del record["languages"]
  (tmp_path / "run.json").write_text(json.dumps(record))
  assert workdir.languages(tmp_path) == Languages.one_pair("en", "de")
  assert workdir.language_pair(tmp_path) == ("en", "de")
  (tmp_path / "run.json").write_text(json.dumps(
      {"model": {}, "launches": [], "tokenizer": {"kind": "fsmt", "langs": ["ru", "en"]}}))
  assert workdir.languages(tmp_path) == Languages.one_pair("ru", "en")
  (tmp_path / "run.json").write_text(json.dumps({"model": {}, "launches": [],
                                                 "tokenizer": {"kind": "marian"}}))
  assert not workdir.languages(tmp_path).stated and workdir.language_pair(tmp_path) is None


TAGGED = Languages(sources=("en",), targets=("deu", "fra"), target_by="source_tag",
                   target_tokens={"deu": ">>deu<<", "fra": ">>fra<<"})


@pytest.mark.parametrize("name, expected, older", [
    # tokenizer_config's pair; an older import's files do not name it.
    ("marian_gelu_separate", Languages.one_pair("en", "de"), Languages()),
    # >>deu<< and >>fra<< in its vocabulary; the source is tokenizer_config's.
    ("marian_swish_shared", TAGGED, dataclasses.replace(TAGGED, sources=())),
    ("fsmt", Languages.one_pair("en", "de"), Languages.one_pair("en", "de"))])  # its langs
def test_imports_state_their_languages(name, expected, older, tmp_path):
  """Written into run.json by the import; an older import without the record reads what
  its files say (FSMT's langs, OPUS-MT's tags in tokenizer/vocab.json)."""
  importer.import_model(FIXTURES / name, tmp_path / "run")
  record = json.loads((tmp_path / "run" / "run.json").read_text())
  assert Languages.from_json(record["languages"]) == expected
  assert workdir.languages(tmp_path / "run") == expected
  del record["languages"]
  (tmp_path / "run" / "run.json").write_text(json.dumps(record))
  assert workdir.languages(tmp_path / "run") == older


def test_a_group_named_opus_mt_folder_states_no_source(tmp_path):
  """en-ROMANCE's kind: tokenizer_config's target_lang names a group, not a code; the tags
  are the targets, and a source_lang that is no code is not stated."""
  folder = tmp_path / "group"
  shutil.copytree(FIXTURES / "marian_swish_shared", folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {**config, "source_lang": "ROMANCE", "target_lang": "ROMANCE"}))
  stated = marian.import_folder(folder).languages
  assert stated == Languages(targets=TAGGED.targets, target_by="source_tag",
                             target_tokens=TAGGED.target_tokens)
  assert stated.check_pair("it", "deu") == ("it", "deu")
  assert stated.check_pair("it", "de") == ("it", "deu")  # Its ISO form names it too.
  with pytest.raises(UnknownLanguageError, match=r"^the model does not translate into 'es': "
                     r"it translates into deu, fra \(from a source it does not state\)$"):
    stated.check_pair("it", "es")


def test_a_multilingual_config_records_every_direction():
  assert languages.from_config({"languages": "en,de,fr"}) == Languages.trained(["en", "de",
                                                                                "fr"])
  assert languages.from_config({"source_lang": "en", "target_lang": "de"}) == (
      Languages.one_pair("en", "de"))
  with pytest.raises(languages.ConfigError, match="two or more distinct language codes"):
    languages.from_config({"languages": "en,en"})


def test_a_pair_may_be_named_by_iso_codes_where_the_model_has_its_own():
  """decode.py --source_lang=en --target_lang=fr and the Translator on an NLLB import
  (eng_Latn, fra_Latn) or an OPUS-MT one (>>fra<<): the ISO 639 form of a model's code
  (language_codes.py, langcodes' data) names it too; the pair comes back in the model's
  codes, which pick its tokens. At c99324a: 'the model does not translate into 'fr''."""
  nllb = Languages(sources=("eng_Latn", "fra_Latn", "zho_Hant"),
                   targets=("eng_Latn", "fra_Latn", "zho_Hant"), target_by="decoder_prefix",
                   target_tokens={c: c for c in ("eng_Latn", "fra_Latn", "zho_Hant")},
                   source_tokens={c: c for c in ("eng_Latn", "fra_Latn", "zho_Hant")})
  assert nllb.check_pair("en", "fr") == ("eng_Latn", "fra_Latn")
  assert nllb.check_pair("FR", "zh-Hant") == ("fra_Latn", "zho_Hant")
  assert nllb.check_pair("eng_Latn", "fra_Latn") == ("eng_Latn", "fra_Latn")
  opus = Languages(sources=("en",), targets=("deu", "fra"), target_by="source_tag",
                   target_tokens={"deu": ">>deu<<", "fra": ">>fra<<"})
  assert opus.check_pair(None, "fr") == ("en", "fra")
  with pytest.raises(UnknownLanguageError, match=r"^the model does not translate into 'it'"):
    nllb.check_pair("en", "it")
