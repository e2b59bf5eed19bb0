"""FSMT (fairseq WMT19) imports: what test_pretrained.py checks for every imported model
(ids, logits, scores, greedy and beam outputs against transformers), plus FSMT's own
corners: FSMTTokenizer on awkward text and its decode(), the output projection's tying,
the config fields with no equivalent refused (naming them), import_model.py then decode.py.
References: tests/fixtures/fsmt, made by tests/fixtures/make_pretrained.py --only=fsmt
(transformers, torch)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, cpu_env
from safetensors.numpy import load_file, save_file
from test_pretrained import id_maps

from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.errors import DataError
from flax_transformer.network.model import Transformer
from flax_transformer.pretrained import convert, importer
from flax_transformer.workdir import read_run

FOLDER = ROOT / "tests" / "fixtures" / "fsmt"
REFERENCES = json.loads((FOLDER / "references.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
  workdir = tmp_path_factory.mktemp("fsmt") / "run"
  importer.import_model(FOLDER, workdir)
  return workdir


def test_tokenizer_corners_are_fsmt_tokenizer(workdir):
  """Special tokens' strings in the text, unicode punctuation, non-printing characters,
  Moses' escapes and dash splits, pieces no vocabulary has; decode() of random ids."""
  source_map, target_map = id_maps(FOLDER, workdir)
  _, tokenizer = read_run(workdir)
  for text, source_ids, target_ids in zip(REFERENCES["edge_texts"],
                                          REFERENCES["edge_source_ids"],
                                          REFERENCES["edge_target_ids"]):
    assert tokenizer.source.tokenize(text).tolist() == source_map[source_ids].tolist(), text
    assert tokenizer.target.tokenize(text).tolist() == target_map[target_ids].tolist(), text
  for ids, text in zip(REFERENCES["decode_ids"], REFERENCES["decode_text"]):
    assert tokenizer.target.detokenize(list(target_map[ids]) + [EOS_ID]) == text, ids


def copy_fixture(tmp_path: Path) -> Path:
  folder = tmp_path / "fsmt"
  shutil.copytree(FOLDER, folder)
  return folder


def edit_json(path: Path, **changes) -> None:
  values = json.loads(path.read_text(encoding="utf-8"))
  for key, value in changes.items():
    if value is None:
      values.pop(key, None)
    else:
      values[key] = value
  path.write_text(json.dumps(values, ensure_ascii=False), encoding="utf-8")


def imported_logits(imported: convert.Imported, maps, i: int = 0) -> np.ndarray:
  """An import's logits [T, V] on reference sentence `i` (`maps`: theirs -> our ids), its
  tree checked as write_workdir checks it."""
  convert.check_tree(imported.params, imported.model_config)
  source_map, target_map = maps
  inputs = jnp.asarray(source_map[REFERENCES["source_ids"][i]])[None]
  targets = jnp.asarray(target_map[REFERENCES["target_ids"][i]])[None]
  model = Transformer(imported.model_config.replace(deterministic=True))
  return np.asarray(model.apply({"params": imported.params}, inputs, targets))[0]


def test_the_output_projection_is_tied_where_transformers_ties_it(tmp_path, workdir):
  """The output projection equal to the target embedding, one of the two absent (a tied
  pair saved once: fairseq's tying, noted), or tie_word_embeddings=True (one matrix for all
  three, saved under any one name): each import computes what the untied import of the
  same matrices computes, with fewer matrices."""
  weights = load_file(str(FOLDER / "model.safetensors"))
  embedding = weights["model.decoder.embed_tokens.weight"]
  # One matrix for the source and target embeddings and the projection, so that all
  # variants are the same function.
  same = dict(weights, **{"model.decoder.output_projection.weight": embedding,
                          "model.encoder.embed_tokens.weight": embedding})

  def without(*parts):
    return {k: v for k, v in same.items() if not any(part in k for part in parts)}

  variants = {"untied": same, "equal": same, "absent": without("output_projection"),
              "embedding_absent": without("decoder.embed_tokens"),
              "all": without("decoder.embed_tokens", "encoder.embed_tokens")}
  maps = id_maps(FOLDER, workdir)  # The variants' vocabularies are the fixture's.
  logits, configs, notes = {}, {}, {}
  for name, tensors in variants.items():
    folder = copy_fixture(tmp_path / name)
    save_file(tensors, str(folder / "model.safetensors"))
    if name == "all":
      edit_json(folder / "config.json", tie_word_embeddings=True)
    imported = importer.import_folder(folder)
    if name == "untied":  # The import that keeps every matrix apart (ties none).
      assert imported.model_config.tie_target_embedding
      imported.params["decoder"]["logits"] = {
          "kernel": imported.params["target_embedding"]["embedding"].T}
      imported.model_config = imported.model_config.replace(tie_target_embedding=False)
    configs[name], notes[name] = imported.model_config, " ".join(imported.notes)
    logits[name] = imported_logits(imported, maps)
  assert all(configs[name].tie_target_embedding for name in ("equal", "absent",
                                                              "embedding_absent"))
  assert configs["all"].share_embeddings and configs["all"].source_vocab_size is None
  assert "output_projection.weight is absent" in notes["absent"]
  assert "embed_tokens.weight is absent" in notes["embedding_absent"]
  assert "absent" not in notes["equal"]
  for name in ("equal", "absent", "embedding_absent", "all"):
    np.testing.assert_allclose(logits[name], logits["untied"], atol=1e-5, rtol=0)
  # The fixture's own projection is another matrix: tying it would change the function.
  with np.load(FOLDER / "logits.npz") as theirs:
    assert np.abs(logits["untied"][:, maps[1]] - theirs["logits_0"]).max() > 0.1


def refusal(tmp_path: Path, change) -> str:
  """The DataError message of importing the fixture after `change(folder)`."""
  folder = copy_fixture(tmp_path)
  change(folder)
  with pytest.raises(DataError) as error:
    importer.import_folder(folder)
  return str(error.value)


@pytest.mark.parametrize("change, message", [
    (lambda f: edit_json(f / "config.json", encoder_ffn_dim=128),
     "encoder_ffn_dim=128 and decoder_ffn_dim=64 differ"),
    (lambda f: edit_json(f / "config.json", activation_function="tanh"),
     "activation_function='tanh' has no equivalent"),
    (lambda f: edit_json(f / "config.json", is_encoder_decoder=False),
     "is_encoder_decoder=False has no equivalent"),
    (lambda f: edit_json(f / "config.json", normalize_before=True),
     "field 'normalize_before' (= True) has no equivalent"),
    (lambda f: edit_json(f / "config.json", hidden_size=64), "hidden_size=64 and d_model=32"),
    (lambda f: edit_json(f / "config.json", langs=["en", "fr"]), "langs=['en', 'de'], but"),
    (lambda f: edit_json(f / "config.json", tgt_vocab_size=500),
     "tgt_vocab_size=500, but vocab-tgt.json has 404"),
    (lambda f: edit_json(f / "config.json", pad_token_id=0),
     "pad_token_id=0, but vocab-src.json has '<pad>' at 1"),
    (lambda f: edit_json(f / "tokenizer_config.json", do_lower_case="yes"),
     "do_lower_case='yes' has no equivalent"),
    (lambda f: edit_json(f / "tokenizer_config.json", unk_token="<UNK>"),
     "unk_token='<UNK>' has no equivalent"),
    (lambda f: edit_json(f / "tokenizer_config.json", added_tokens_decoder={
        "404": {"content": "<2de>", "special": True}}), "only the special tokens"),
    (lambda f: (f / "merges.txt").unlink(), "merges.txt not found"),
    (lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
     "has pytorch_model.bin but no model.safetensors"),
    (lambda f: save_file(dict(load_file(str(f / "model.safetensors")), **{
        "model.decoder.embed_positions.weight": np.ones((130, 32), np.float32)}),
        str(f / "model.safetensors")),
     "model.decoder.embed_positions.weight is not fairseq's sinusoidal table"),
    (lambda f: save_file(dict(load_file(str(f / "model.safetensors")), extra=np.ones(3)),
                         str(f / "model.safetensors")),
     "tensors with no place in the model: ['extra']"),
], ids=["ffn_dims", "activation", "encoder_decoder", "unknown_field", "alias", "langs",
        "vocab_size", "pad_id", "lower_case", "unk_token", "added_token", "merges", "torch_only",
        "positions", "extra_tensor"])
def test_what_has_no_equivalent_is_refused_naming_it(tmp_path, change, message):
  assert message in refusal(tmp_path, change)


def test_a_wmt19_length_position_table_from_torch_is_fairseqs(tmp_path):
  """WMT19's tables have 1026 rows. transformers computes their frequencies with torch's
  float32 exp, at times an ulp from numpy's, so row r's angles drift by up to r ulps
  (6.1e-5 at row 710 of transformers 5.24's 1026 x 1024 table): such a table is
  fairseq's and imports; another layout of the same size is refused."""
  def with_positions(folder: Path, table: np.ndarray) -> Path:
    edit_json(folder / "config.json", max_position_embeddings=1024)
    weights = load_file(str(folder / "model.safetensors"))
    for side in ("encoder", "decoder"):
      weights[f"model.{side}.embed_positions.weight"] = table
    save_file(weights, str(folder / "model.safetensors"))
    return folder

  half = 16  # The fixture's d_model is 32.
  step = np.float32(np.log(10000.0) / (half - 1))
  frequencies = np.nextafter(np.exp(np.arange(half, dtype=np.float32) * -step), np.float32(0))
  angle = np.arange(1026, dtype=np.float32)[:, None] * frequencies[None]
  table = np.concatenate([np.sin(angle), np.cos(angle)], 1).astype(np.float32)
  table[1] = 0.0  # The padding row.
  imported = importer.import_folder(with_positions(copy_fixture(tmp_path / "torch"), table))
  assert imported.model_config.max_len == 1024
  interleaved = np.stack([np.sin(angle), np.cos(angle)], 2).reshape(1026, 32)
  with pytest.raises(DataError, match="embed_positions.weight is not fairseq's"):
    importer.import_folder(with_positions(copy_fixture(tmp_path / "other"), interleaved))


def test_import_model_py_then_decode_py_translate_as_transformers(tmp_path):
  """The command line: the import, then decode.py's beam 4 at transformers' length rule
  (alpha 0, EOS within the beam, the same limit) gives generate()'s outputs."""
  workdir = tmp_path / "run"
  imported = subprocess.run([sys.executable, "import_model.py", f"--from={FOLDER}",
                             f"--workdir={workdir}"], cwd=ROOT, env=cpu_env(),
                            capture_output=True, text=True, timeout=300)
  assert imported.returncode == 0, imported.stderr[-2000:]
  record = json.loads((workdir / "run.json").read_text())
  assert record["imported_from"]["architecture"] == "fsmt"
  assert record["tokenizer"]["kind"] == "fsmt"
  sources = tmp_path / "sources.en"
  sources.write_text("\n".join(REFERENCES["sources"]) + "\n", encoding="utf-8")
  decoded = subprocess.run(
      [sys.executable, "decode.py", f"--workdir={workdir}", f"--input={sources}",
       "--beam_size=4", "--alpha=0", "--eos_within_beam",
       f"--max_extra={REFERENCES['max_extra']}"],
      cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=600)
  assert decoded.returncode == 0, decoded.stderr[-2000:]
  assert decoded.stdout.splitlines() == REFERENCES["beam4_text"]

