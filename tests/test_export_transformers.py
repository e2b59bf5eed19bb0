"""export.py --format=transformers: a MarianMTModel folder that import_model.py reads back
as the same function (the importer is checked against transformers itself in
test_pretrained.py; bench/export_transformers.py checks the export against transformers),
an imported Marian model written back as its own weights, and what Marian cannot express
refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import cpu_env
from flax_transformer import Transformer, TransformerConfig
from flax_transformer.errors import ConfigError
from flax_transformer.export import folder_files, marian
from flax_transformer.pretrained import importer
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
FILES = ["config.json", "generation_config.json", "manifest.json", "model.safetensors",
         "source.spm", "target.spm", "tokenizer_config.json", "vocab.json"]


def export(workdir, out, *flags):
  return subprocess.run([sys.executable, str(ROOT / "export.py"), f"--workdir={workdir}",
                         f"--out={out}", "--format=transformers", *flags],
                        capture_output=True, text=True, env=cpu_env(), cwd=ROOT)


def validation(multi30k_dir, count):
  import gzip

  with gzip.open(Path(multi30k_dir) / "val.en.gz", "rt", encoding="utf-8") as f:
    return [next(f).rstrip("\n") for _ in range(count)]


def test_a_trained_model_goes_out_and_comes_back_as_the_same_function(
    trained_tiny, multi30k_dir, tmp_path):
  """The tiny trained run (post-norm, no attention biases, interleaved positions, LayerNorm
  epsilon 1e-6): the folder's files, then import_model.py on it: the same token ids,
  logits within 1e-4 (the importer takes Marian's epsilon, 1e-5: the export's one
  inexactness, logged) and the same greedy translations."""
  out = tmp_path / "hf"
  done = export(trained_tiny, out, "--beam_size=3", "--alpha=0.8")
  assert done.returncode == 0, done.stderr[-3000:]
  warnings = [line for line in done.stderr.splitlines() if "epsilon" in line]
  assert len(warnings) == 1 and "1e-05" in warnings[0] and "1e-06" in warnings[0], done.stderr
  # Its start token's row is trained: CTranslate2's converter (a zero start) would differ.
  assert "start_from_zero_embedding=True" in done.stderr
  assert folder_files(out) == FILES
  assert json.loads((out / "manifest.json").read_text())["files"] == FILES
  assert (out / "source.spm").read_bytes() == (trained_tiny / "vocab.model").read_bytes()
  assert (out / "target.spm").read_bytes() == (trained_tiny / "vocab.model").read_bytes()
  run = json.loads((trained_tiny / "run.json").read_text())
  ours = TransformerConfig.from_dict(run["model"])
  size = ours.vocab_size
  config = json.loads((out / "config.json").read_text())
  assert {k: config[k] for k in ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers",
                                 "decoder_ffn_dim", "decoder_attention_heads",
                                 "max_position_embeddings", "activation_function",
                                 "scale_embedding", "pad_token_id", "eos_token_id",
                                 "decoder_start_token_id", "share_encoder_decoder_embeddings",
                                 "tie_word_embeddings")} == {
      "vocab_size": size, "decoder_vocab_size": size, "d_model": ours.d_model,
      "encoder_layers": ours.encoder_layers, "decoder_ffn_dim": ours.d_ff,
      "decoder_attention_heads": ours.num_heads, "max_position_embeddings": ours.max_len,
      "activation_function": "relu", "scale_embedding": True,
      # OPUS-MT's order: EOS 0, unk 1, padding (our 0, the decoder's start) last.
      "pad_token_id": size - 1, "eos_token_id": 0, "decoder_start_token_id": size - 1,
      "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True}
  generation = json.loads((out / "generation_config.json").read_text())
  assert (generation["num_beams"], generation["length_penalty"],
          generation["bad_words_ids"]) == (3, 0.8, [[size - 1]])
  vocab = json.loads((out / "vocab.json").read_text())
  assert (vocab["</s>"], vocab["<unk>"], vocab["<pad>"]) == (0, 1, size - 1)
  tensors = load_file(str(out / "model.safetensors"))
  assert tensors["model.shared.weight"].shape == (size, ours.d_model)
  assert not tensors["model.encoder.layers.0.self_attn.q_proj.bias"].any()  # None here.
  from flax_transformer.cli.export import check_out

  assert check_out(str(out), str(trained_tiny), overwrite=True) == out  # An export's folder.

  back = tmp_path / "back"
  importer.import_model(out, back)
  original = Translator.from_workdir(trained_tiny, search=SearchConfig(beam_size=1),
                                     average_last=5, devices=jax.devices()[:1])
  imported = Translator.from_workdir(back, search=SearchConfig(beam_size=1),
                                     devices=jax.devices()[:1])
  sentences = validation(multi30k_dir, 24)
  targets = validation(multi30k_dir, 24)[::-1]  # Any text: both sides are one vocabulary.
  logits = []
  for translator in (original, imported):
    sources = [translator.tokenizer.source.tokenize(s) for s in sentences]
    outputs = [translator.tokenizer.target.tokenize(t) for t in targets]
    assert [t.tolist() for t in sources + outputs] == [
        original.tokenizer.tokenize(t).tolist() for t in sentences + targets]
    width = max(map(len, sources + outputs))
    x, y = ([np.pad(r, (0, width - len(r))) for r in rows] for rows in (sources, outputs))
    config, params = translator.member(0)
    logits.append(np.asarray(Transformer(config.replace(deterministic=True)).apply(
        {"params": params}, jnp.asarray(x), jnp.asarray(y))))
  real = np.asarray(y) != 0  # Both padded alike: the ids are the same.
  v = logits[0].shape[-1]  # The import pads the vocabulary: its added rows' logits -inf.
  assert logits[1].shape[-1] % 128 == 0 and np.all(np.isneginf(logits[1][..., v:]))
  np.testing.assert_allclose(logits[1][real][:, :v], logits[0][real], atol=1e-4, rtol=0)
  assert imported.translate(sentences) == original.translate(sentences)


def test_a_model_started_from_a_zero_vector_goes_out_with_padding_rows_of_zeros(
    trained_tiny, multi30k_dir, tmp_path, caplog):
  """start_from_zero_embedding: row 0, which the model never reads (here the trained run's
  row, left as it is), is written as zeros, with no warning about CTranslate2's zero start;
  import_model.py reads the option back, and the same function."""
  translator = Translator.from_workdir(trained_tiny, devices=jax.devices()[:1])
  config, params = translator.member(0)
  config = config.replace(start_from_zero_embedding=True, deterministic=True)
  assert np.any(np.asarray(params["shared_embedding"]["embedding"])[0])
  out = marian.convert(config, params, translator.tokenizer, tmp_path / "hf",
                       search={"beam_size": 4, "alpha": 0.6})
  assert not any("CTranslate2" in r.getMessage() for r in caplog.records)
  shared = load_file(str(out / "model.safetensors"))["model.shared.weight"]
  assert not shared[-1].any() and np.all(np.any(shared[:-1] != 0, axis=1))  # Padding last.
  importer.import_model(out, tmp_path / "back")
  back_config, back_params = Translator.from_workdir(
      tmp_path / "back", devices=jax.devices()[:1]).member(0)
  assert back_config.start_from_zero_embedding
  rows = [translator.tokenizer.tokenize(s) for s in validation(multi30k_dir, 8)]
  width = max(map(len, rows))
  x = jnp.asarray(np.stack([np.pad(r, (0, width - len(r))) for r in rows]))
  y = x[::-1]
  logits = [np.asarray(Transformer(c.replace(deterministic=True)).apply({"params": p}, x, y))
            for c, p in ((config, params), (back_config, back_params))]
  real, v = np.asarray(y) != 0, logits[0].shape[-1]  # The import's padding rows: -inf.
  assert np.all(np.isneginf(logits[1][..., v:]))
  np.testing.assert_allclose(logits[1][real][:, :v], logits[0][real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["marian_swish_shared", "marian_gelu_separate"])
def test_an_imported_marian_model_goes_back_out_as_its_own_weights(name, tmp_path):
  """transformers' tiny Marian models (swish and a shared vocabulary; gelu, separate
  vocabularies; biases everywhere, a final_logits_bias, halves positions, epsilon 1e-5),
  imported and exported again: the same tensors, vocabularies, ids and fields. The import
  padded each vocabulary to split over a tensor axis; the export drops the padding."""
  folder = FIXTURES / name
  importer.import_model(folder, tmp_path / "run")
  translator = Translator.from_workdir(tmp_path / "run", devices=jax.devices()[:1])
  config, params = translator.member(0)
  assert config.vocab_size % 128 == config.source_vocab % 128 == 0 and config.vocab_padding
  out = marian.convert(config, params, translator.tokenizer, tmp_path / "hf",
                       search={"beam_size": 4, "alpha": 0.6})
  theirs, ours = (json.loads((f / "config.json").read_text()) for f in (folder, out))
  for key in ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers",
              "encoder_attention_heads", "encoder_ffn_dim", "activation_function",
              "scale_embedding", "max_position_embeddings", "share_encoder_decoder_embeddings",
              "tie_word_embeddings", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
    assert ours[key] == theirs[key], key
  vocabularies = ["vocab.json"] + (["target_vocab.json"] if "separate" in name else [])
  for vocab in vocabularies:
    assert json.loads((out / vocab).read_text()) == json.loads((folder / vocab).read_text())
  for spm in ("source.spm", "target.spm"):
    assert (out / spm).read_bytes() == (folder / spm).read_bytes()
  original = load_file(str(folder / "model.safetensors"))
  exported = load_file(str(out / "model.safetensors"))
  tied = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
          "lm_head.weight"} if "shared" in name else {"lm_head.weight"}
  expected = {k for k in original if "embed_positions" not in k} - tied
  assert set(exported) == expected
  for key in expected:
    np.testing.assert_array_equal(exported[key], original[key], err_msg=key)


@pytest.mark.parametrize("variant, message", [
    ({"norm": "pre"}, "pre-norm"),
    ({"positional": "learned"}, "learned positions cannot be exported"),
    ({"position_frequencies": "fairseq"}, "position table is not Marian's"),
    ({"position_offset": 2}, "position table is not Marian's"),
    ({"d_k": 4, "d_v": 4}, "d_k = d_v = d_model / num_heads")])
def test_what_marian_cannot_express_is_refused(variant, message, multi30k_tokenizer, tmp_path):
  config = TransformerConfig(vocab_size=multi30k_tokenizer.vocab_size, d_model=16, d_ff=32,
                             num_heads=2, num_layers=1, max_len=32, **variant)
  ids = jnp.ones((1, 4), jnp.int32)
  params = jax.jit(Transformer(config).init)(jax.random.PRNGKey(0), ids, ids)["params"]
  with pytest.raises(ConfigError, match=message):
    marian.convert(config, params, multi30k_tokenizer, tmp_path / "hf",
                   search={"beam_size": 4, "alpha": 0.6})
  assert not (tmp_path / "hf").exists()


def test_an_imported_fsmt_model_is_refused(tmp_path):
  """FSMT's fairseq positions and Moses + BPE tokenizer: nothing Marian has."""
  importer.import_model(FIXTURES / "fsmt", tmp_path / "run")
  translator = Translator.from_workdir(tmp_path / "run", devices=jax.devices()[:1])
  config, params = translator.member(0)
  with pytest.raises(ConfigError, match="^--format=transformers: "):
    marian.convert(config, params, translator.tokenizer, tmp_path / "hf",
                   search={"beam_size": 4, "alpha": 0.6})
  assert not (tmp_path / "hf").exists()


def test_out_in_a_bucket_or_the_workdir_is_refused_before_loading(tmp_path):
  (tmp_path / "run").mkdir()
  for out, says in (("gs://bucket/hf", "is a bucket"), (tmp_path / "run", "is or holds")):
    done = export(tmp_path / "run", out)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], done.stderr
  from flax_transformer.cli.export import run_export

  with pytest.raises(ConfigError, match="--quantization=int8 is CTranslate2's"):
    run_export(workdir=str(tmp_path / "run"), out=str(tmp_path / "hf"), fmt="transformers",
               search=SearchConfig(), batch_tokens=4096, average_last=5, checkpoint_step=None,
               platforms=["cpu"], quantization="int8", overwrite=False)
