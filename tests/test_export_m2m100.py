"""export.py --format=transformers of an imported M2M100 / NLLB-200 workdir: the
M2M100ForConditionalGeneration folder transformers made (tests/fixtures/m2m100 and nllb,
by tests/fixtures/make_m2m100.py) comes back out, the import's vocabulary padding dropped
and its permutation undone, and import_model.py reads the export back as the same
workdir. (bench/export_m2m100.py checks, with torch, that transformers loads the export
and that its greedy outputs and scores equal decode.py's: results/bench/export_m2m100.json.)"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import cpu_env
from flax_transformer.averaging import load_params
from flax_transformer.errors import ConfigError
from flax_transformer.export import m2m100
from flax_transformer.pretrained import importer
from flax_transformer.translation.translator import Translator
from flax_transformer.workdir import languages as workdir_languages
from flax_transformer.workdir import read_run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
CONFIG_KEYS = ("vocab_size", "d_model", "encoder_layers", "decoder_layers",
               "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
               "decoder_ffn_dim", "activation_function", "scale_embedding",
               "max_position_embeddings", "tie_word_embeddings", "pad_token_id", "bos_token_id",
               "eos_token_id", "decoder_start_token_id", "model_type")


def export(workdir, out):
  return subprocess.run([sys.executable, str(ROOT / "export.py"), f"--workdir={workdir}",
                         f"--out={out}", "--format=transformers"],
                        capture_output=True, text=True, env=cpu_env(), cwd=ROOT)


@pytest.mark.parametrize("name", ["m2m100", "nllb"])
def test_an_imported_m2m100_model_goes_back_out_as_transformers_made_it(name, tmp_path):
  folder = FIXTURES / name
  importer.import_model(folder, tmp_path / "run")
  done = export(tmp_path / "run", tmp_path / "hf")
  assert done.returncode == 0, done.stderr[-2000:]
  out = tmp_path / "hf"
  # The weights transformers saved, tensor for tensor: its rows again (the import padded
  # them to a multiple of 128, and put pad, EOS, unknown first), in transformers' order.
  original, exported = (load_file(str(f / "model.safetensors")) for f in (folder, out))
  assert sorted(exported) == sorted(original)
  for key in original:
    np.testing.assert_array_equal(exported[key], original[key], err_msg=key)
  theirs, ours = (json.loads((f / "config.json").read_text()) for f in (folder, out))
  assert {k: ours[k] for k in CONFIG_KEYS} == {k: theirs[k] for k in CONFIG_KEYS}
  assert (out / "sentencepiece.bpe.model").read_bytes() == (
      folder / "sentencepiece.bpe.model").read_bytes()
  settings = json.loads((out / "tokenizer_config.json").read_text())
  original_settings = json.loads((folder / "tokenizer_config.json").read_text())
  for key in ("tokenizer_class", "src_lang") + (
      ("language_codes", "num_madeup_words") if name == "m2m100" else ("legacy_behaviour",)):
    assert settings[key] == original_settings[key], key
  if name == "m2m100":
    assert json.loads((out / "vocab.json").read_text()) == json.loads(
        (folder / "vocab.json").read_text())
  else:  # The added tokens (ids and flags: <mask> strips the space before it), as
    # transformers' tokenizer.json has them.
    added = {t.pop("id"): t for t in json.loads(
        (folder / "tokenizer.json").read_text())["added_tokens"]}
    assert {int(i): t for i, t in settings["added_tokens_decoder"].items()} == added


def test_an_nllb_export_names_its_codes_as_transformers_4_and_5_read_them(tmp_path):
  """transformers 4.x's tokenizers take `extra_special_tokens` as a dict of named tokens
  (4.57.6 saved nllb_v4 with {}); the export wrote the codes' list there, which 4.57.6's
  from_pretrained failed on ('list' object has no attribute 'keys'). The codes go in
  `additional_special_tokens`, as 4.57.6 wrote them, which 5.24.0 reads too (checked by
  hand: both load the export, ids and greedy outputs the source folder's)."""
  importer.import_model(FIXTURES / "nllb", tmp_path / "run")
  done = export(tmp_path / "run", tmp_path / "hf")
  assert done.returncode == 0, done.stderr[-2000:]
  settings = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
  saved_by_4 = json.loads((FIXTURES / "nllb_v4" / "tokenizer_config.json").read_text())
  assert settings["additional_special_tokens"] == saved_by_4["additional_special_tokens"]
  assert isinstance(settings.get("extra_special_tokens", {}), type(
      saved_by_4["extra_special_tokens"]))


@pytest.mark.parametrize("name", ["m2m100", "nllb"])
def test_the_export_imports_back_as_the_same_workdir(name, tmp_path):
  importer.import_model(FIXTURES / name, tmp_path / "run")
  assert export(tmp_path / "run", tmp_path / "hf").returncode == 0
  importer.import_model(tmp_path / "hf", tmp_path / "back")
  (config, tokenizer), (again, tokenizer_again) = (
      read_run(tmp_path / w) for w in ("run", "back"))
  assert again == config and config.vocab_padding > 0  # Padded (nllb: 409 -> 512 rows).
  assert workdir_languages(tmp_path / "back") == workdir_languages(tmp_path / "run")
  ref = json.loads((FIXTURES / name / "references.json").read_text(encoding="utf-8"))
  code = workdir_languages(tmp_path / "run").source_tokens
  for text in ref["sources"][:6] + ref["targets"][:6] + ref["edge_texts"]:
    for tagged in (text, f"{code[sorted(code)[1]]} {text}"):
      assert tokenizer_again.tokenize(tagged).tolist() == tokenizer.tokenize(tagged).tolist()
  params, _ = load_params(tmp_path / "run", config)
  params_again, _ = load_params(tmp_path / "back", again)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  leaves_again = jax.tree_util.tree_leaves_with_path(params_again)
  assert [p for p, _ in leaves] == [p for p, _ in leaves_again]
  for (path, a), (_, b) in zip(leaves, leaves_again):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=str(path))


@pytest.mark.parametrize("field, value", [("norm", "post"), ("layer_norm_epsilon", 1e-6),
                                          ("position_offset", 0)])
def test_what_m2m100_cannot_express_is_refused_before_writing(field, value, tmp_path):
  """Pre-norm, LayerNorm epsilon 1e-5 and fairseq's positions (offset 2) are M2M100's,
  fixed: a model otherwise is refused in one line, nothing written."""
  importer.import_model(FIXTURES / "nllb", tmp_path / "run")
  translator = Translator.from_workdir(tmp_path / "run", devices=jax.devices()[:1])
  config, params = translator.member(0)
  changed = config.replace(**{field: value})
  with pytest.raises(ConfigError, match=f"^--format=transformers: M2M100 needs {field}="):
    m2m100.convert(changed, params, translator.tokenizer, tmp_path / "hf",
                   search={"beam_size": 1, "alpha": 0.0})
  assert not (tmp_path / "hf").exists()
