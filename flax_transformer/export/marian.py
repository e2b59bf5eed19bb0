"""A trained model as a transformers MarianMTModel folder (export.py --format=transformers).

Files: config.json and generation_config.json (MarianConfig, GenerationConfig),
model.safetensors, source.spm and target.spm (our one sentencepiece vocabulary,
twice), vocab.json (piece -> id, our ids), tokenizer_config.json (MarianTokenizer),
and ours: manifest.json (format, provenance, the files: what --overwrite replaces).
No torch needed: numpy and safetensors write it.

How our model becomes transformers' Marian (models/marian/modeling_marian.py, 5.x):
- Positions. Marian adds fixed sinusoids of the paper's frequencies with the sines in
  the first half of the model dimension and the cosines in the second; ours
  interleave them (section 3.5). Permuting the model dimension everywhere
  (embeddings, each linear's input or output side that is the model dimension,
  LayerNorm scales and biases) is an exact reparametrization: LayerNorm, the
  residual sums and every dot product over it are unchanged by a permutation. The
  permutation is the one under which our position table (as our module adds it)
  equals Marian's, checked on the tables; a table that no permutation makes
  Marian's is refused. Learned positions are refused: Marian never loads its
  table (recomputed at load, `_keys_to_ignore_on_save`).
- Biases. Every Marian projection has one; those ours lack (attention_bias=False,
  the paper's) are written as zeros. Marian has a final_logits_bias: zeros too.
- Post-norm only (Marian has no final LayerNorm): pre-norm is refused. So is
  d_k * heads != d_model (Marian's head width is d_model / heads).
- Embeddings times sqrt(d_model): scale_embedding. One matrix for source, target
  and the pre-softmax layer: share_encoder_decoder_embeddings and
  tie_word_embeddings; with share_embeddings=False, three matrices.
- LayerNorm epsilon. Marian's nn.LayerNorm(d_model) has torch's 1e-5, with no
  config field; ours is 1e-6 by default. LN(c x; eps) = LN(x; eps / c^2), so
  sqrt(10) times every LayerNorm's input would be exact. Inside each stack it can
  be had (scale the previous LayerNorm's gamma and beta and every output
  projection by c, divide the consuming projections by c), but not at the first
  LayerNorm of each stack: its residual input is the embedding plus Marian's
  fixed position table, which cannot be scaled. There is no exact
  reparametrization, so the weights are written as they are and export.py logs a
  warning naming both epsilons. Measured (results/bench/export_transformers.json,
  docs/decoding.md: a Multi30k model, d_model 256, 3+3 layers, 50 test 2016
  sentences): transformers' logits within 9.3e-5 of ours as loaded, 1.1e-5 with our
  epsilon put in its norms (float rounding); greedy outputs equal on all 50, scores
  within 1.5e-4. The epsilon's effect is far below what changes an output or a score
  at 1e-3, so refusing would lose every model trained here for no measurable gain.
- Ids: OPUS-MT's order, EOS 0, unk 1, ... and padding last: Marian id m is our
  id m + 1, and our 0 (padding, and the decoder's start token) is Marian's V - 1,
  its pad_token_id and decoder_start_token_id. Reordering the embedding's rows
  (and the logits') with the vocabulary is exact, and CTranslate2's converter for
  Marian needs it: it drops the last row as Marian's added padding token (with
  padding first it drops a real piece's row and refuses the model). Our search
  never emits padding; transformers 5's Marian leaves that to the generation
  config, as OPUS-MT's do: bad_words_ids [[V - 1]].
- CTranslate2's converter starts the decoder from a zero vector
  (start_from_zero_embedding: OPUS-MT's padding row is zeros), where transformers
  embeds the start token. A model trained with start_from_zero_embedding (and an
  imported OPUS-MT model, whose padding row is zeros) holds that row at zero, so the
  two agree; the paper's default trains the start token's row, and a model
  converted that way is not ours at the first step (no reparametrization moves it:
  Marian's position table is fixed). export.py warns then; --format=ctranslate2
  converts our model itself either way.
- Search: num_beams is export.py's --beam_size. transformers divides a
  hypothesis's score by its length ** length_penalty, not by GNMT's
  ((5 + length) / 6) ** alpha as we do: length_penalty is set to alpha, the same
  exponent on another rule. max_length allows max_len tokens (our positions), with
  EOS forced at the limit (forced_eos_token_id) as our search forces it.
- Languages. A model trained here on several languages is told its target by the
  target side's tokens of '<2de>' ('▁', '<2de>': a sentencepiece user-defined symbol
  after the space marker, as training's targets start) forced after the start token.
  transformers' configs force one token at most (forced_bos_token_id), so no file of
  theirs can say it; generate takes it per call, as its decoder_input_ids (generate
  puts the start token first): tokenizer(text_target="<2de>",
  add_special_tokens=False).input_ids, whose tokens the output then starts with.
  manifest.json holds the workdir's languages record (import_model.py reads it back).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from flax_transformer.errors import ConfigError
from flax_transformer.export import bart, layout
from flax_transformer.languages import Languages
from flax_transformer.network import config_fields
from flax_transformer.network.activations import ACTIVATIONS
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import sinusoidal_position_encoding
from flax_transformer.pretrained.marian import EXPORTED

FORMAT = EXPORTED  # manifest.json's (import_model.py reads its languages back).
ARCHITECTURE = "MarianMTModel"  # config.json's; export.py names it.
LOADED_BY = "MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained"
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian's layers keep.
# The computed config fields (network/config_fields.py) this export writes; any other
# away from its default is refused, named, so that a field added to the model is never
# exported as if it were not there. Cannot express: pre-norm, learned positions, d_k != d_v.
# position_layout, position_frequencies and position_offset are checked on the table the
# model adds (`permutation`).
MAPPED = {"vocab_size", "d_model", "d_ff", "num_heads", "d_k", "d_v", "num_layers",
          "num_encoder_layers", "num_decoder_layers", "max_len", "share_embeddings",
          "attention_bias", "positional", "norm", "layer_norm_epsilon", "dropout_rate",
          "attention_dropout_rate", "activation", "scale_embedding", "position_layout",
          "position_frequencies", "position_offset", "final_logits_bias", "source_vocab_size",
          "tie_target_embedding", "decoder_start_id", "start_from_zero_embedding",
          "vocab_padding", "source_vocab_padding"}  # The padding rows are dropped.


def check(config: TransformerConfig) -> None:
  """ConfigError naming what Marian cannot express, before anything is written."""
  if problem := config_fields.refusal(config, MAPPED, "--format=transformers",
                                      "transformers' Marian export"):
    raise ConfigError(problem)
  if config.norm != "post":
    raise ConfigError("--format=transformers: this model is pre-norm; transformers' Marian "
                      "is post-norm only (no final LayerNorm)")
  if config.positional != "sinusoidal":
    raise ConfigError(f"--format=transformers: {config.positional} positions cannot be "
                      "exported: transformers' Marian recomputes its sinusoidal table at "
                      "load")
  if config.head_dim_k * config.num_heads != config.d_model or (
      config.head_dim_k != config.head_dim_v):
    raise ConfigError(f"--format=transformers: Marian needs d_k = d_v = d_model / num_heads; "
                      f"this model has d_k={config.head_dim_k}, d_v={config.head_dim_v}, "
                      f"d_model={config.d_model}, num_heads={config.num_heads}")


def permutation(config: TransformerConfig, model: layout.Model) -> np.ndarray:
  """int [D]: Marian's model-dimension index j holds our index perm[j]; the one under
  which both our position tables are Marian's, or ConfigError."""
  d = config.d_model
  theirs = sinusoidal_position_encoding(config.max_len, d, layout="halves")  # transformers'.
  halves = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
  for perm in (halves, np.arange(d)):
    if all(np.allclose(stack.positions[:, perm], theirs, rtol=0, atol=1e-5)
           for stack in (model.encoder, model.decoder)):
      return perm
  raise ConfigError("--format=transformers: this model's position table is not Marian's "
                    "sinusoids (sines of the paper's frequencies, then cosines) in any "
                    "order of the model dimension")


def vocabulary_order(vocab_size: int) -> np.ndarray:
  """int [V]: Marian's id m is our id order[m] (padding, our 0, last)."""
  return np.roll(np.arange(vocab_size), -1)


def _tensors(config: TransformerConfig, model: layout.Model, perm: np.ndarray
             ) -> dict[str, np.ndarray]:
  """MarianMTModel's state dict: our arrays, the model dimension permuted by `perm`, the
  vocabulary reordered (`vocabulary_order`)."""
  out = bart.layer_tensors(model, perm)

  def embedding(matrix: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(matrix[vocabulary_order(len(matrix))][:, perm])

  if config.share_embeddings:
    out["model.shared.weight"] = embedding(model.encoder.embedding)  # Tied: lm_head too.
  else:
    out["model.encoder.embed_tokens.weight"] = embedding(model.encoder.embedding)
    out["model.decoder.embed_tokens.weight"] = embedding(model.decoder.embedding)
    if not config.tie_target_embedding:
      out["lm_head.weight"] = embedding(model.logits)
  bias = model.logits_bias
  out["final_logits_bias"] = (np.zeros((1, model.logits.shape[0]), np.float32) if bias is None
                              else bias[vocabulary_order(len(bias))][None])
  return out


def marian_ids(config: TransformerConfig) -> dict[str, int]:
  """Our special ids as Marian's (`vocabulary_order`)."""
  ours = np.argsort(vocabulary_order(config.vocab_size))  # Our target id -> Marian's.
  return {"pad_token_id": int(ours[PAD_ID]), "eos_token_id": int(ours[EOS_ID]),
          "forced_eos_token_id": int(ours[EOS_ID]),
          "decoder_start_token_id": int(ours[config.decoder_start_id])}


def marian_config(config: TransformerConfig) -> dict[str, Any]:
  """config.json: MarianConfig's fields."""
  return {
      "architectures": [ARCHITECTURE], "model_type": "marian",
      "vocab_size": config.source_vocab, "decoder_vocab_size": config.vocab_size,
      "d_model": config.d_model, "encoder_layers": config.encoder_layers,
      "decoder_layers": config.decoder_layers, "encoder_attention_heads": config.num_heads,
      "decoder_attention_heads": config.num_heads, "encoder_ffn_dim": config.d_ff,
      "decoder_ffn_dim": config.d_ff, "activation_function": ACTIVATIONS[config.activation].transformers[0],
      "max_position_embeddings": config.max_len, "scale_embedding": config.scale_embedding,
      "share_encoder_decoder_embeddings": config.share_embeddings,
      "tie_word_embeddings": config.share_embeddings or config.tie_target_embedding,
      "dropout": config.dropout_rate, "attention_dropout": config.attention_dropout_rate,
      "activation_dropout": 0.0, **marian_ids(config), "bos_token_id": None,
      "is_encoder_decoder": True, "dtype": "float32"}


def generation_config(config: TransformerConfig, search: dict[str, Any]) -> dict[str, Any]:
  """generation_config.json: our search's settings, as far as transformers has them."""
  ids = marian_ids(config)
  return {**ids, "bad_words_ids": [[ids["pad_token_id"]]],
          "num_beams": search["beam_size"], "length_penalty": search["alpha"],
          "max_length": config.max_len + 1}  # The start token, then max_len tokens.


def tokenizer_files(config: TransformerConfig, tokenizer) -> dict[str, Any]:
  """MarianTokenizer's files (name -> bytes or JSON value) for `tokenizer`: a trained
  sentencepiece vocabulary (`data.tokenizer.Tokenizer`, both sides) or an imported
  Marian model's (`pretrained.tokenizers`, its files under the workdir's tokenizer/).
  Each vocab.json is reordered as the embedding rows (`vocabulary_order`)."""
  from flax_transformer.pretrained.tokenizers import MarianSide

  if isinstance(tokenizer, Tokenizer):
    models = {"source.spm": tokenizer.model_bytes(), "target.spm": tokenizer.model_bytes()}
  elif isinstance(getattr(tokenizer, "source", None), MarianSide):
    models = {name: (Path(tokenizer.path) / name).read_bytes()
              for name in ("source.spm", "target.spm")}
  else:
    raise ConfigError(f"--format=transformers: this workdir's tokenizer "
                      f"({type(tokenizer.source).__name__}) has no MarianTokenizer equivalent")
  real = config.without_vocab_padding()  # An import's padding rows are not written.
  sides = {"vocab.json": (tokenizer.source, config.source_vocab, real.source_vocab),
           "target_vocab.json": (tokenizer.target, config.vocab_size, real.vocab_size)}
  separate = not config.share_embeddings
  files: dict[str, Any] = dict(models)
  for name, (side, size, rows) in list(sides.items())[:2 if separate else 1]:
    if side.vocab_size != size:
      raise ConfigError(f"--format=transformers: the model has {size} ids on the "
                        f"{'target' if name.startswith('target') else 'source'} side, its "
                        f"vocabulary {side.vocab_size}")
    pieces = side.pieces(range(rows))
    if "<unk>" not in pieces:
      raise ConfigError("--format=transformers: MarianTokenizer needs an '<unk>' piece; this "
                        "vocabulary has none")
    files[name] = {pieces[ours]: theirs for theirs, ours in enumerate(vocabulary_order(rows))}
  pieces = tokenizer.target.pieces([PAD_ID, EOS_ID])
  files["tokenizer_config.json"] = {
      "tokenizer_class": "MarianTokenizer", "unk_token": "<unk>", "eos_token": pieces[1],
      "pad_token": pieces[0], "model_max_length": config.max_len, "separate_vocabs": separate,
      # As our outputs are written: an imported tokenizer's clean-up, else none.
      "clean_up_tokenization_spaces": bool((getattr(tokenizer, "spec", None) or {}).get(
          "clean_up_tokenization_spaces"))}
  return files


def convert(config: TransformerConfig, params: dict[str, Any], tokenizer, out_dir: str | Path,
            *, search: dict[str, Any], provenance: dict | None = None,
            languages: Languages | None = None) -> Path:
  """Writes a MarianMTModel folder to `out_dir` (see the module's docstring).

  tokenizer: the workdir's (`tokenizer_files`). search: beam_size, alpha
  (generation_config.json's num_beams, length_penalty). languages: the workdir's
  record, into manifest.json.
  """
  from safetensors.numpy import save

  check(config)
  files = tokenizer_files(config, tokenizer)
  model = layout.unpack(config, params)
  perm = permutation(config, model)
  if config.layer_norm_epsilon != LAYER_NORM_EPSILON:
    logging.warning("transformers' Marian normalises with LayerNorm epsilon %g, this model "
                    "with %g: no exact reparametrization exists (flax_transformer/export/"
                    "marian.py), so its logits differ slightly (on a Multi30k model: "
                    "results/bench/export_transformers.json)", LAYER_NORM_EPSILON,
                    config.layer_norm_epsilon)
  if not config.start_from_zero_embedding:
    logging.warning("CTranslate2's converter for transformers' Marian starts the decoder from "
                    "a zero vector, this model from its start token's trained row: what it "
                    "converts is not this model (train with --config.model."
                    "start_from_zero_embedding=True for one it converts exactly, or use "
                    "--format=ctranslate2)")
  files["config.json"] = marian_config(config.without_vocab_padding())
  files["generation_config.json"] = generation_config(config.without_vocab_padding(), search)
  # As bytes: safetensors' save_file makes its file private (0600), unlike the others.
  files["model.safetensors"] = save(_tensors(config, model, perm), metadata={"format": "pt"})
  if languages is not None and languages.target_by == "decoder_prefix":
    token = languages.target_tokens[languages.targets[0]]
    logging.info("Its target is chosen by a token after the start token: in transformers, "
                 "generate(..., decoder_input_ids=tokenizer(text_target=%r, "
                 "add_special_tokens=False, return_tensors='pt').input_ids) (the codes' tokens: "
                 "manifest.json's languages)", token)
  return bart.write_folder(out_dir, files, {"format": FORMAT, "max_len": config.max_len,
                                            "search": search, **bart.languages_entry(languages),
                                            **(provenance or {})})
