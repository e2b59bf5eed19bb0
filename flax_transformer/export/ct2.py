"""A trained model as a CTranslate2 model directory (ctranslate2's TransformerSpec).

What the spec must say, and where our model says it:
- post-LN (paper) or pre-LN with final norms: `TransformerConfig.norm`;
- token embeddings scaled by sqrt(d_model) (`scale_embeddings`), one matrix for
  source, target and the pre-softmax projection when `share_embeddings`;
- positions: our sinusoidal (or learned) table itself, so the interleaved
  sin/cos layout of section 3.5 is kept (CTranslate2's own table is not ours);
- attention projections without biases unless `attention_bias`; self-attention's
  W^Q, W^K, W^V fused, cross-attention's W^K, W^V fused, as CTranslate2 stores them;
- decoding starts from id 0 (our shifted-right start token), so the vocabulary's
  piece 0 is the decoder start token; sources end with EOS (translate.py adds it);
- an imported M2M100 / NLLB-200 model (`m2m100_files`): pre-LN, fairseq's sinusoid
  (offset 2: our table, as above), the decoder starting from EOS, the import's
  vocabulary padding (`vocab_padding`) dropped; the target language is the decoder's
  first output, forced by CTranslate2's `target_prefix` (the languages record in
  manifest.json names each code's token). No translate.py: CTranslate2 and
  sentencepiece.bpe.model translate it (docs/pretrained.md).

The parameters come from `layout.unpack` ([out, in] weights, as CTranslate2's).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, UNK_ID, Tokenizer
from flax_transformer.errors import ConfigError
from flax_transformer.export import layout, write_manifest, write_vocabulary
from flax_transformer.export.runner import CT2_FORMAT
from flax_transformer.languages import Languages
from flax_transformer.network import config_fields
from flax_transformer.network.activations import ACTIVATIONS
from flax_transformer.network.config import TransformerConfig

# The computed config fields (network/config_fields.py) this export writes: any other
# away from its default is refused. Cannot express: d_k != d_v, or an activation
# CTranslate2 lacks (network/activations.py's ctranslate2 column).
HANDLED = frozenset({
    "vocab_size", "d_model", "d_ff", "num_heads", "d_k", "d_v", "num_layers",
    "num_encoder_layers", "num_decoder_layers", "max_len", "share_embeddings",
    "attention_bias", "positional", "norm", "layer_norm_epsilon", "activation",
    "scale_embedding", "position_layout", "position_frequencies", "position_offset",
    "final_logits_bias", "source_vocab_size", "tie_target_embedding", "decoder_start_id",
    "start_from_zero_embedding", "vocab_padding", "source_vocab_padding"})
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")


def require_ctranslate2() -> None:
  """ConfigError with the install line where ctranslate2 is not installed."""
  if importlib.util.find_spec("ctranslate2") is None:
    raise ConfigError("CTranslate2 is not installed: pip install -e '.[ctranslate2]'")


def _kind(tokenizer) -> str | None:
  """An imported model's tokenizer kind (run.json's spec), None for a vocab.model."""
  return (getattr(tokenizer, "spec", None) or {}).get("kind")


def m2m100_files(folder: Path, tokenizer, languages: Languages | None) -> dict:
  """An imported M2M100 / NLLB model's tokenizer beside CTranslate2's files: its
  sentencepiece.bpe.model, whose pieces are the vocabulary's, and the manifest's entries
  (run.json's tokenizer spec and languages record: each code's token, forced as
  `target_prefix`, and put in the source as the spec says)."""
  name = "sentencepiece.bpe.model"
  (folder / name).write_bytes((Path(tokenizer.path) / name).read_bytes())
  return {"tokenizer": {**tokenizer.spec, "files": [name]},
          **({"languages": languages.to_json()} if languages is not None else {})}


def _set_linear(spec, linears: list[layout.Linear]) -> None:
  """One CTranslate2 linear of `linears` fused along their outputs."""
  spec.weight = np.concatenate([linear.weight for linear in linears])
  if linears[0].bias is not None:
    spec.bias = np.concatenate([linear.bias for linear in linears])


def _set_norm(spec, norm: layout.Norm) -> None:
  spec.gamma, spec.beta = norm.scale, norm.bias


def _set_attention(spec, attention: layout.Attention, fused: tuple[tuple[str, ...], ...]
                   ) -> None:
  """fused: the projections of each of CTranslate2's input linears, in order
  (self-attention: one fused Q/K/V; cross-attention: Q, then fused K/V)."""
  for linear, names in zip(spec.linear, fused):
    _set_linear(linear, [getattr(attention, name) for name in names])
  _set_linear(spec.linear[-1], [attention.out])
  _set_norm(spec.layer_norm, attention.norm)


SELF_ATTENTION = (("query", "key", "value"),)
CROSS_ATTENTION = (("query",), ("key", "value"))


def _set_ffn(spec, layer: layout.Layer) -> None:
  _set_linear(spec.linear_0, [layer.w1])
  _set_linear(spec.linear_1, [layer.w2])
  _set_norm(spec.layer_norm, layer.ffn_norm)


def check(config: TransformerConfig) -> None:
  """ConfigError naming what CTranslate2 cannot express, before anything is written."""
  if problem := config_fields.refusal(config, HANDLED, "--format=ctranslate2",
                                      "CTranslate2's TransformerSpec"):
    raise ConfigError(problem)
  if ACTIVATIONS[config.activation].ctranslate2 is None:
    raise ConfigError(f"--format=ctranslate2: CTranslate2 has no {config.activation} "
                      "activation")


def build_spec(config: TransformerConfig, params: dict[str, Any], tokenizer: Tokenizer):
  """Our parameters in a ctranslate2.specs.TransformerSpec (vocabulary registered)."""
  require_ctranslate2()
  from ctranslate2.specs import common_spec, transformer_spec

  if config.head_dim_k * config.num_heads != config.d_model or (
      config.head_dim_k != config.head_dim_v):
    raise ConfigError(f"CTranslate2 needs d_k = d_v = d_model / num_heads; this model has "
                      f"d_k={config.head_dim_k}, d_v={config.head_dim_v}, "
                      f"d_model={config.d_model}, num_heads={config.num_heads}")
  check(config)
  ours = layout.unpack(config, params)
  pre_norm = config.norm == "pre"
  spec = transformer_spec.TransformerSpec.from_config(
      (config.encoder_layers, config.decoder_layers), config.num_heads, pre_norm=pre_norm,
      activation=getattr(common_spec.Activation,
                         ACTIVATIONS[config.activation].ctranslate2))
  spec.config.layer_norm_epsilon = config.layer_norm_epsilon
  encoder, decoder = spec.encoder, spec.decoder
  # The import's padding rows (never produced, vocab_padding) are not written.
  rows = config.vocab_size - config.vocab_padding
  source_rows = rows if config.share_embeddings else len(ours.encoder.embedding)
  encoder.embeddings[0].weight = ours.encoder.embedding[:source_rows]
  decoder.embeddings.weight = ours.decoder.embedding[:rows]
  # x sqrt(d_model) (section 3.4) unless the model's config says not.
  encoder.scale_embeddings = decoder.scale_embeddings = config.scale_embedding
  encoder.position_encodings.encodings = ours.encoder.positions
  decoder.position_encodings.encodings = ours.decoder.positions
  # Row 0 is zeros then (`layout.unpack`); CTranslate2 says so in its own words too.
  decoder.start_from_zero_embedding = config.start_from_zero_embedding
  decoder.projection.weight = ours.logits[:rows]  # The target embedding when tied.
  if ours.logits_bias is not None:  # An imported Marian model's final_logits_bias.
    decoder.projection.bias = ours.logits_bias[:rows]
  if pre_norm:
    _set_norm(encoder.layer_norm, ours.encoder.final_norm)
    _set_norm(decoder.layer_norm, ours.decoder.final_norm)
  for layer, mine in zip(encoder.layer, ours.encoder.layers):
    _set_attention(layer.self_attention, mine.self_attention, SELF_ATTENTION)
    _set_ffn(layer.ffn, mine)
  for layer, mine in zip(decoder.layer, ours.decoder.layers):
    _set_attention(layer.self_attention, mine.self_attention, SELF_ATTENTION)
    _set_attention(layer.attention, mine.cross_attention, CROSS_ATTENTION)
    _set_ffn(layer.ffn, mine)

  # Each side's pieces (one vocabulary, or an imported model's two).
  source = tokenizer.source.pieces(range(source_rows))
  pieces = tokenizer.target.pieces(range(rows))
  spec.register_source_vocabulary(source)
  spec.register_target_vocabulary(pieces)
  # Our decoder starts from id 0 (embedded as decoder_start_id) and never emits 0; EOS
  # ends a sentence.
  spec.config.decoder_start_token = pieces[config.decoder_start_id]
  # fairseq's dictionaries (M2M100, NLLB) have their own '<s>', as CTranslate2's converter.
  spec.config.bos_token = "<s>" if _kind(tokenizer) == "m2m100" else pieces[
      config.decoder_start_id]
  spec.config.eos_token = pieces[EOS_ID]
  spec.config.unk_token = pieces[UNK_ID]
  return spec


def convert(config: TransformerConfig, params: dict[str, Any], tokenizer: Tokenizer,
            out_dir: str | Path, *, quantization: str = "float32",
            search: dict[str, Any] | None = None, provenance: dict | None = None,
            languages: Languages | None = None) -> Path:
  """Writes a CTranslate2 model directory to `out_dir`.

  CTranslate2's model.bin, config.json and vocabulary, plus ours: vocab.model,
  manifest.json (ids, max_len, `search` settings as translate.py's defaults, the files
  written) and translate.py (`runner.py`; ctranslate2 and sentencepiece only); an
  imported M2M100 / NLLB model: its sentencepiece.bpe.model and `languages` (the
  workdir's record) in the manifest instead of vocab.model and translate.py.
  quantization: the weights' storage type (CTranslate2 converts at load otherwise).
  """
  if quantization not in QUANTIZATIONS:
    raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                      f"got {quantization!r}")
  spec = build_spec(config, params, tokenizer)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  spec.validate()
  spec.optimize(quantization=None if quantization == "float32" else quantization)
  spec.save(str(out))
  if _kind(tokenizer) == "m2m100":
    vocabulary = m2m100_files(out, tokenizer, languages)
  else:
    vocabulary = write_vocabulary(out, tokenizer, languages)
    shutil.copyfile(Path(__file__).with_name("runner.py"), out / "translate.py")
  manifest = {"format": CT2_FORMAT, "quantization": quantization, "max_len": config.max_len,
              "pad_id": PAD_ID, "eos_id": EOS_ID,
              "search": search or {"beam_size": 4, "alpha": 0.6, "max_extra": 50},
              **vocabulary,
              **(provenance or {})}
  write_manifest(out, manifest)
  return out
