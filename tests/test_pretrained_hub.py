"""Folders as the hub's users have them (tests/fixtures/make_hub_folders.py, made with
transformers 4.57 and 5.24; neither is needed here): every key transformers defines is
classified, folders saved by either release and a 2020-21 OPUS-MT config.json import and
translate as transformers does, and the imported tokenizers give transformers' ids and
texts on generated strings (special tokens' text, tags, unicode, whitespace)."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flax_transformer import workdir as workdir_lib
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.pretrained import fsmt, hub_keys, importer, marian, tokenizers
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HUB = FIXTURES / "hub"
MAJORS = ("4", "5")
SPECIALS = ("</s>", "<unk>", "<pad>")


def id_map(folder: Path, tokenizer_dir: Path, name: str) -> np.ndarray:
  """transformers' ids of `folder`'s vocabulary file `name` -> the imported ones."""
  theirs = json.loads((folder / name).read_text())
  ours = json.loads((tokenizer_dir / name).read_text())
  table = np.zeros(len(theirs), np.int64)
  for piece, i in theirs.items():
    table[i] = ours[piece]
  return table


@pytest.mark.parametrize("major", MAJORS)
def test_every_key_transformers_defines_is_classified(major):
  """hub_keys (or the architecture's own table) says what each key of transformers'
  PretrainedConfig / PreTrainedTokenizerBase means: none is refused as unknown."""
  keys = json.loads((HUB / f"keys_{major}.json").read_text())
  assert keys["transformers"].startswith(f"{major}.")
  config_tables = (hub_keys.CONFIG_KEYS, marian.FIELDS, fsmt.FIELDS)
  tokenizer_tables = (hub_keys.TOKENIZER_KEYS, marian.TOKENIZER_FIELDS, fsmt.TOKENIZER_FIELDS)
  for names, tables in ((keys["config_keys"], config_tables),
                        (keys["tokenizer_keys"], tokenizer_tables)):
    unknown = [n for n in names if not any(n in table for table in tables)]
    assert not unknown, f"transformers {keys['transformers']} defines {unknown}"


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
  """name -> (tokenizer, tokenizer with clean_up_tokenization_spaces, transformers' ids ->
  ours) for the committed references' three tokenizers."""
  out = {}
  for name, folder, vocab in (("marian_swish_shared", "marian_swish_shared", "vocab.json"),
                              ("marian_gelu_separate_target", "marian_gelu_separate",
                               "target_vocab.json"), ("fsmt", "fsmt", "vocab-tgt.json")):
    imported = importer.import_folder(FIXTURES / folder)
    directory = tmp_path_factory.mktemp(name)
    for file, data in imported.tokenizer_files.items():
      (directory / file).write_bytes(data)
    spec = imported.tokenizer_spec
    source_map = id_map(FIXTURES / folder, directory, "vocab-src.json" if name == "fsmt"
                        else "vocab.json")
    out[name] = (tokenizers.load(directory, spec),
                 tokenizers.load(directory, {**spec, "clean_up_tokenization_spaces": True}),
                 source_map, id_map(FIXTURES / folder, directory, vocab))
  return out


def side_of(name, tokenizer):
  """The side transformers' references encode with: the target's for text_target ones."""
  return tokenizer.target if name.endswith("_target") else tokenizer.source


def encode_map(name, maps):
  return maps[1] if name.endswith("_target") else maps[0]


@pytest.mark.parametrize("major", MAJORS)
def test_tokenizers_equal_transformers_on_every_committed_string(sides, major):
  """Ids (source side, or target side for text_target) and decode(skip_special_tokens,
  clean_up_tokenization_spaces False and True) equal transformers' on each string."""
  ref = json.loads((HUB / f"tokenizers_{major}.json").read_text())
  for name, (plain, clean, *maps) in sides.items():
    for text, row in zip(ref["strings"], ref[name]):
      if max(row["ids"]) >= len(encode_map(name, maps)):
        # MarianTokenizer gives a target's '<pad>' text the SOURCE vocabulary's pad id,
        # outside a separate target vocabulary (transformers' bug): here it is the
        # target's pad. Only such strings differ.
        assert name.endswith("_target") and "<pad>" in text, (name, text)
        continue
      ids = side_of(name, plain).tokenize(text).tolist()
      assert ids == encode_map(name, maps)[row["ids"]].tolist(), (name, text)
      # transformers decodes every id as a target id (FSMT's source ids too); EOS left out.
      body = [i for i in maps[1][row["ids"]].tolist() if i != EOS_ID]
      assert plain.target.detokenize(body) == row["decode"], (name, text)
      assert clean.target.detokenize(body) == row["decode_clean"], (name, text)


_REF = json.loads((HUB / "tokenizers_5.json").read_text())


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.tuples(st.integers(0, len(_REF["strings"]) - 1),
                                st.sampled_from(SPECIALS)), min_size=1, max_size=4),
       name=st.sampled_from(("marian_swish_shared", "marian_gelu_separate_target", "fsmt")))
def test_a_text_is_cut_at_special_tokens_as_transformers_cuts_it(sides, parts, name):
  """Committed strings joined by special tokens' text: transformers' ids of each string
  (without its EOS), each joiner's id between them, EOS at the end (its tokenizers encode
  each piece between special tokens alone)."""
  tokenizer, _, *maps = sides[name]
  side = side_of(name, tokenizer)
  special_ids = dict(zip(SPECIALS, side.encode_batch(list(SPECIALS))))
  text, expected = "", []
  for index, special in parts:
    assume(max(_REF[name][index]["ids"]) < len(encode_map(name, maps)))  # The '<pad>' bug.
    text += _REF["strings"][index] + special
    expected += encode_map(name, maps)[_REF[name][index]["ids"][:-1]].tolist()
    expected += special_ids[special]
  assert side.tokenize(text).tolist() == expected + [EOS_ID]


def opus_mt_2020_folder(tmp_path: Path) -> Path:
  """marian_swish_shared under the 2020-21 hub config.json and tokenizer_config.json."""
  folder = tmp_path / "opus_mt_2020"
  shutil.copytree(FIXTURES / "marian_swish_shared", folder)
  hub = json.loads((HUB / "opus_mt_2020.json").read_text())
  (folder / "config.json").write_text(json.dumps(hub["config"], indent=2))
  (folder / "tokenizer_config.json").write_text(json.dumps(hub["tokenizer_config"]))
  return folder


def test_hub_folders_import_and_translate_as_transformers(tmp_path):
  """A folder saved by transformers 4.57 (its tokenizer_config.json with
  clean_up_tokenization_spaces=true) imports; token ids, greedy outputs (ids and text) and
  summed log-probabilities are transformers' (1e-3). A folder with the 2020-21 OPUS-MT
  config.json keys over the same weights imports to the same model, whose outputs
  transformers 5 gives under that config; each records its languages."""
  folder = FIXTURES / "marian_v4"
  ref = json.loads((folder / "references.json").read_text())
  assert ref["transformers"].startswith("4.")
  workdir = tmp_path / "marian_v4_run"
  importer.import_model(folder, workdir)
  translator = Translator.from_workdir(workdir, search=SearchConfig(max_extra=20, beam_size=1),
                                       devices=jax.devices()[:1])
  vocab = id_map(folder, workdir / "tokenizer", "vocab.json")
  for source, ids in zip(ref["sources"], ref["source_ids"]):
    assert translator.tokenizer.source.tokenize(source).tolist() == vocab[ids].tolist()
  scores = translator.score(ref["sources"], ref["targets"])
  np.testing.assert_allclose([s for s, _ in scores], ref["log_probs"], atol=1e-3, rtol=0)
  sources = [vocab[ids].astype(np.int32) for ids in ref["source_ids"]]
  found = [h[0][0] for h in translator.translate_nbest_ids(sources)]
  assert found == [[i for i in vocab[ids].tolist() if i != EOS_ID] for ids in ref["greedy"]]
  assert [translator.tokenizer.target.detokenize(ids) for ids in found] == ref["greedy_text"]
  # marian_swish_shared's vocabulary has >>deu<< and >>fra<<: a multilingual target side.
  languages = workdir_lib.languages(workdir)
  assert (languages.sources, languages.targets) == (("en",), ("deu", "fra"))

  hub = json.loads((HUB / "opus_mt_2020.json").read_text())
  old = importer.import_folder(opus_mt_2020_folder(tmp_path))
  new = importer.import_folder(folder)
  assert old.model_config.replace(dropout_rate=0.0) == new.model_config  # 2020's rate: 0.1.
  jax.tree.map(np.testing.assert_array_equal, old.params, new.params)
  theirs = hub["references"]  # transformers 5 under the 2020 config, on the same sentences.
  assert theirs["sources"] == ref["sources"] and theirs["greedy"] == ref["greedy"]
  np.testing.assert_allclose(theirs["log_probs"], ref["log_probs"], atol=1e-4, rtol=0)
  directory = tmp_path / "opus_mt_2020_tokenizer"
  directory.mkdir()
  for name, data in old.tokenizer_files.items():
    (directory / name).write_bytes(data)
  tokenizer = tokenizers.load(directory, old.tokenizer_spec)  # No clean-up: 2020's default.
  assert [tokenizer.target.detokenize(ids) for ids in found] == theirs["greedy_text"]
  assert (old.languages.sources, old.languages.targets) == (("en",), ("deu", "fra"))


@pytest.mark.parametrize("name", ["marian_gelu_separate", "fsmt"])
def test_configs_saved_by_transformers_4_import_as_5s_do(tmp_path, name):
  """The fixture's config.json and tokenizer_config.json as transformers 4.57 saves them
  (hub/saved_by_4.json) give the model 5.24's files give, and the tokenizer with
  clean_up_tokenization_spaces."""
  saved = json.loads((HUB / "saved_by_4.json").read_text())
  assert saved["transformers"].startswith("4.")
  folder = tmp_path / name
  shutil.copytree(FIXTURES / name, folder)
  for file, content in saved[name].items():
    (folder / file).write_text(json.dumps(content))
  old, new = importer.import_folder(folder), importer.import_folder(FIXTURES / name)
  assert old.model_config == new.model_config
  jax.tree.map(np.testing.assert_array_equal, old.params, new.params)
  assert old.tokenizer_spec == {**new.tokenizer_spec, "clean_up_tokenization_spaces": True}
  assert old.tokenizer_files == new.tokenizer_files


def test_the_exported_runner_tokenizes_as_the_import(sides, tmp_path):
  """export.py's runner restates the Marian tokenizer (it travels without the package):
  on every committed string it gives the imported tokenizer's ids and texts, clean-up
  included where the spec asks for it."""
  from flax_transformer.export.runner import _MarianVocabulary

  for name in ("marian_swish_shared", "marian_gelu_separate_target"):
    plain, clean, *_ = sides[name]
    for tokenizer in (plain, clean):
      runner = _MarianVocabulary(Path(tokenizer.path), tokenizer.spec)
      for text in _REF["strings"]:
        ids = runner.encode(text)
        assert ids == tokenizer.source.encode_batch([text])[0], text
        targets = [i for i in ids if i < tokenizer.target.vocab_size and i != EOS_ID]
        assert runner.decode(targets) == tokenizer.target.detokenize(targets), text


def test_a_transformers_export_keeps_the_clean_up(tmp_path):
  """export.py --format=transformers of a model imported with
  clean_up_tokenization_spaces=true writes it so that MarianTokenizer's outputs are ours
  (a trained workdir's, and one imported without it, write false)."""
  from flax_transformer.export.marian import tokenizer_files

  for folder, wanted in ((FIXTURES / "marian_v4", True),
                         (FIXTURES / "marian_swish_shared", False)):
    imported = importer.import_folder(folder)
    directory = tmp_path / folder.name
    directory.mkdir()
    for name, data in imported.tokenizer_files.items():
      (directory / name).write_bytes(data)
    tokenizer = tokenizers.load(directory, imported.tokenizer_spec)
    written = tokenizer_files(imported.model_config, tokenizer)["tokenizer_config.json"]
    assert written["clean_up_tokenization_spaces"] is wanted


def test_special_tokens_written_as_added_token_objects_import(tmp_path):
  """4.x releases wrote a special token made as an AddedToken as an object: the same token
  where it strips nothing; one that strips spaces (another tokenization) is refused."""
  from flax_transformer.errors import DataError

  folder = tmp_path / "added"
  shutil.copytree(FIXTURES / "marian_v4", folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  token = {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": True,
           "rstrip": False, "single_word": False}
  (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": token}))
  assert importer.import_folder(folder).tokenizer_files == importer.import_folder(
      FIXTURES / "marian_v4").tokenizer_files
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {**config, "eos_token": {**token, "lstrip": True}}))
  with pytest.raises(DataError, match="eos_token=.* has no equivalent here .only '</s>'"):
    importer.import_folder(folder)


def test_an_added_token_beyond_the_specials_is_refused(tmp_path):
  """transformers cuts an added token's text out of sources as it cuts the specials';
  this tokenizer cuts the specials only, so a folder with another is one line."""
  from flax_transformer.errors import DataError

  folder = tmp_path / "added"
  shutil.copytree(FIXTURES / "marian_swish_shared", folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  config["added_tokens_decoder"]["511"] = {"content": "<sep>", "lstrip": False,
                                           "normalized": False, "rstrip": False,
                                           "single_word": False, "special": False}
  (folder / "tokenizer_config.json").write_text(json.dumps(config))
  with pytest.raises(DataError, match="added_tokens_decoder=.* has no equivalent here "
                                      r"\(only the special tokens"):
    importer.import_folder(folder)


@pytest.mark.parametrize("file, content, message", [
    ("special_tokens_map.json", {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                                 "additional_special_tokens": ["<mask>"]},
     r"special_tokens_map.json: additional_special_tokens=\['<mask>'\] has no equivalent "
     r"here \(only \[\] or None\)"),
    ("added_tokens.json", {"<mask>": 511},
     r"added_tokens.json: added tokens \['<mask>'\] have no equivalent here \(MarianTokenizer "
     r"cuts their text out of sources; only '</s>', '<unk>', '<pad>' are cut here\)"),
])
def test_a_pre_4_34_folders_added_tokens_are_refused(tmp_path, file, content, message):
  """A tokenizer_config.json without added_tokens_decoder (the hub's 2020-21 OPUS-MT
  uploads) leaves the tokens to special_tokens_map.json and added_tokens.json, which
  MarianTokenizer 4.57 and 5.24 read: "A man <mask> woman" is [8, 20, 511, 53, 0] there,
  '<mask>' one added id. This import cuts at the three specials only, so such a folder is
  one line naming the file; the plain special_tokens_map.json the hub's folders carry
  imports. Before: both files were never read, and '<mask>' became five pieces."""
  from flax_transformer.errors import DataError

  folder = tmp_path / "opus_mt"
  shutil.copytree(FIXTURES / "marian_v4", folder)
  (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en",
                                                            "target_lang": "de"}))
  plain = importer.import_folder(folder)  # Its special_tokens_map.json: the three specials.
  assert plain.tokenizer_files == importer.import_folder(FIXTURES / "marian_v4").tokenizer_files
  (folder / file).write_text(json.dumps(content))
  with pytest.raises(DataError, match=message) as raised:
    importer.import_folder(folder)
  assert str(raised.value).startswith(str(folder / file))


def test_null_tokenizer_switches_import_as_transformers_reads_them(tmp_path):
  """tokenizer_config.json's clean_up_tokenization_spaces and separate_vocabs as null:
  MarianTokenizer (4.57 and 5.24) loads them as False (no clean-up, one vocabulary), and
  so does this import; null separate_vocabs beside separate embeddings is the
  contradiction False is. Before: both refused ("only True or False")."""
  from flax_transformer.errors import DataError

  folder = tmp_path / "nulls"
  shutil.copytree(FIXTURES / "marian_v4", folder)
  config = json.loads((folder / "tokenizer_config.json").read_text())
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {**config, "clean_up_tokenization_spaces": None, "separate_vocabs": None}))
  imported = importer.import_folder(folder)
  reference = importer.import_folder(FIXTURES / "marian_v4")
  assert imported.tokenizer_files == reference.tokenizer_files
  assert imported.tokenizer_spec == {"kind": "marian", "separate_vocabularies": False}
  separate = tmp_path / "separate"
  shutil.copytree(FIXTURES / "marian_gelu_separate", separate)
  config = json.loads((separate / "tokenizer_config.json").read_text())
  (separate / "tokenizer_config.json").write_text(json.dumps({**config, "separate_vocabs": None}))
  with pytest.raises(DataError, match="separate_vocabs=None contradicts config.json's "
                                      "share_encoder_decoder_embeddings=False"):
    importer.import_folder(separate)
