"""M2M100 and NLLB-200 (transformers' M2M100ForConditionalGeneration) -> this project's
Transformer.

fairseq's pre-norm transformer: a LayerNorm before each sublayer and a final one on each
stack (`norm='pre'`), biases on every projection, ReLU, LayerNorm epsilon 1e-5, embeddings
times sqrt(d_model) (`scale_embedding`), fairseq's sinusoid (sines then cosines,
frequencies 10000^(-i/(d_model/2 - 1)), token j at row j + pad + 1, the padding row
zero), one embedding shared by encoder, decoder and the output projection (no logits
bias), the decoder starting from EOS. The target language is the decoder's first output,
forced (generate's forced_bos_token_id): a target per sentence, run.json's languages
record with target_by 'decoder_prefix'; the source's language token is the tokenizer's
(m2m100_tokenizer). Ids are permuted to the project's (pad 0, EOS 1, unknown 2).

`FIELDS` says what each M2M100Config field becomes here, or why it does not change the
function; any other field, or a value this code does not implement, is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flax_transformer.errors import DataError
from flax_transformer.languages import Languages
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import sinusoidal_position_encoding
from flax_transformer.pretrained import bart_config
from flax_transformer.pretrained import convert
from flax_transformer.pretrained import m2m100_tokenizer as tok
from flax_transformer.pretrained import vocab_padding
from flax_transformer.pretrained import weights as streamed

ARCHITECTURE = "m2m_100"
CLASSES = ("M2M100ForConditionalGeneration",)
EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight",
              "model.decoder.embed_tokens.weight", "lm_head.weight")
# M2M100Config's defaults, for fields a config.json leaves out.
DEFAULTS = {"vocab_size": 128112, "max_position_embeddings": 1024, "encoder_layers": 12,
            "encoder_ffn_dim": 4096, "encoder_attention_heads": 16, "decoder_layers": 12,
            "decoder_ffn_dim": 4096, "decoder_attention_heads": 16, "d_model": 1024,
            "activation_function": "relu", "dropout": 0.1, "attention_dropout": 0.1,
            "scale_embedding": True, "pad_token_id": 1, "eos_token_id": 2,
            "decoder_start_token_id": 2, "tie_word_embeddings": True}
FIELDS: dict = {
    **convert.BART_FIELDS,
    "vocab_size": convert.must_be_int(1),
    "num_hidden_layers": lambda v: None,  # An alias of encoder_layers (checked equal).
    "tie_word_embeddings": convert.must_be(True),
    "decoder_vocab_size": "not an M2M100Config field (written by some conversions, unused)",
}
TOKENIZER_CLASSES = ("M2M100Tokenizer", "NllbTokenizer", "NllbTokenizerFast")
TOKENIZER_FIELDS: dict = {
    **convert.TOKENIZER_GENERIC,
    "tokenizer_class": convert.must_be(*TOKENIZER_CLASSES),
    "bos_token": convert.must_be("<s>"), "eos_token": convert.must_be("</s>"),
    "sep_token": convert.must_be("</s>"), "cls_token": convert.must_be("<s>"),
    "pad_token": convert.must_be("<pad>"), "unk_token": convert.must_be("<unk>"),
    "mask_token": lambda v: None,  # An added token: its id is read with the others.
    "sp_model_kwargs": convert.must_be({}), "legacy_behaviour": convert.must_be(True, False),
    "src_lang": "the default source language (recorded)", "tgt_lang": "a target is per call",
    "language_codes": convert.must_be("m2m100", "wmt21"),
    "num_madeup_words": convert.must_be_int(0),
    "additional_special_tokens": "the language codes (read)",
    "extra_special_tokens": "the language codes (read)",
    "added_tokens_decoder": "the added tokens' ids (read)",
    "is_local": "bookkeeping", "local_files_only": "bookkeeping",
    "vocab_file": "bookkeeping", "spm_file": "bookkeeping", "tokenizer_file": "bookkeeping",
}


def import_folder(folder: Path, dtype: str = "float32") -> convert.Imported:
  """The model, tokenizer and languages of the transformers M2M100/NLLB folder `folder`;
  its tensors streamed one at a time, cast to float32 or (dtype='stored') as stored."""
  where = folder / "config.json"
  config = convert.read_config(folder, ARCHITECTURE, CLASSES)
  convert.check_fields(config, FIELDS, where)
  config = {**DEFAULTS, **config}
  tokenizer_config = convert.read_json(folder, "tokenizer_config.json")
  convert.check_fields(tokenizer_config, TOKENIZER_FIELDS, folder / "tokenizer_config.json")
  notes = convert.training_only_notes(config)
  rows = config["vocab_size"]
  vocab, codes, spec = _tokenizer(folder, tokenizer_config, rows)
  pad, eos = config["pad_token_id"], config["eos_token_id"]
  for piece, value, field in (("<pad>", pad, "pad_token_id"), ("</s>", eos, "eos_token_id")):
    if vocab[piece] != value:
      raise DataError(f"{where}: {field}={value}, but the tokenizer has {piece!r} at "
                      f"{vocab[piece]}")
  order = convert.project_order(rows, pad=pad, eos=eos, unk=vocab["<unk>"])
  start = config["decoder_start_token_id"]
  if not isinstance(start, int) or not 0 <= start < rows:
    raise DataError(f"{where}: decoder_start_token_id={start!r} is not an id")
  model_config = model_config_from(config, where,
                                   decoder_start_id=int(np.argsort(order)[start]))
  weights = streamed.read(folder, dtype)
  model_config = model_config.replace(param_dtype=weights.param_dtype)
  params = _params(weights, model_config, order, pad, folder / "model.safetensors")
  model_config, padded = vocab_padding.padded_config(model_config, rows)  # As _params did.
  notes += padded
  spm_bytes, _ = tok.read_spm(folder)
  permuted = vocab_padding.fill_rows(convert.permuted_vocab(vocab, order),
                                     model_config.vocab_size, folder / "config.json")
  files = {tok.FILES[0]: spm_bytes, tok.FILES[1]: tok.dumps(permuted)}
  languages = Languages(sources=tuple(codes), targets=tuple(codes), target_by="decoder_prefix",
                        target_tokens=dict(codes), source_tokens=dict(codes))
  return convert.Imported(ARCHITECTURE, model_config, params, spec, files, notes, languages)


def _tokenizer(folder: Path, tokenizer_config: dict, rows: int):
  """(piece -> transformers id over `rows`, language code -> token, run.json's tokenizer
  spec) of the folder's M2M100Tokenizer or NllbTokenizer."""
  kind = tokenizer_config.get("tokenizer_class", "NllbTokenizer" if (
      folder / "tokenizer.json").is_file() else "M2M100Tokenizer")
  where = folder / "tokenizer_config.json"
  _, model = tok.read_spm(folder)
  if kind == "M2M100Tokenizer":
    base = convert.read_vocabulary(folder, "vocab.json", tok.SPECIALS)
    codes = tok.M2M100_CODES[tokenizer_config.get("language_codes", "m2m100")]
    vocab, tokens = tok.m2m100_vocabulary(base, codes, tokenizer_config.get(
        "num_madeup_words", 8), rows, folder / "config.json")
    first, default = True, tokens.get(tokenizer_config.get("src_lang") or "en")
  else:
    added = _nllb_added(folder, tokenizer_config, model)
    vocab = tok.nllb_vocabulary(model, added, rows, folder / "config.json")
    codes = [c for c in added.values() if c not in tok.SPECIALS and c != "<mask>"]
    if not codes:
      raise DataError(f"{where}: no language codes (additional_special_tokens or "
                      "tokenizer.json's added tokens, as eng_Latn)")
    tokens = {code: code for code in codes}
    first = not tokenizer_config.get("legacy_behaviour", False)
    default = tokenizer_config.get("src_lang") or ("eng_Latn" if "eng_Latn" in tokens else None)
  spec = {"kind": "m2m100", "tokenizer_class": kind, "language_tokens": list(tokens.values()),
          "source_language_first": first, "default_source_token": default,
          "clean_up_tokenization_spaces": bool(tokenizer_config.get(
              "clean_up_tokenization_spaces", False))}
  return vocab, tokens, spec


def _nllb_added(folder: Path, tokenizer_config: dict, model) -> dict[int, str]:
  """NllbTokenizer's added tokens (id -> content): tokenizer.json's list where the folder
  has it (transformers 5 writes it), else tokenizer_config.json's added_tokens_decoder, else
  fairseq's layout of its language codes (len(spm) + 1 + i, then '<mask>')."""
  if (folder / "tokenizer.json").is_file():
    added = convert.read_json(folder, "tokenizer.json").get("added_tokens")
    where = folder / "tokenizer.json"
  else:
    added = [dict(value, id=int(key)) for key, value in
             (tokenizer_config.get("added_tokens_decoder") or {}).items()]
    where = folder / "tokenizer_config.json"
  if added:
    if not isinstance(added, list) or not all(
        isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(
            t.get("content"), str) for t in added):
      raise DataError(f"{where}: added tokens are not a list of {{id, content}}")
    return {t["id"]: t["content"] for t in added if t["content"] not in tok.SPECIALS}
  codes = tokenizer_config.get("additional_special_tokens") or tokenizer_config.get(
      "extra_special_tokens") or []
  base = model.get_piece_size() + 1
  return {**{base + i: c for i, c in enumerate(codes)}, base + len(codes): "<mask>"}


def model_config_from(config: dict, where: Path, *, decoder_start_id: int) -> TransformerConfig:
  """The TransformerConfig of an M2M100Config (`config`: config.json over DEFAULTS)."""
  return bart_config.model_config_from(
      config, where, vocab_size=config["vocab_size"], d_model=config["d_model"],
      d_ff=config["encoder_ffn_dim"], num_heads=config["encoder_attention_heads"],
      num_layers=config["encoder_layers"], num_decoder_layers=config["decoder_layers"],
      dropout_rate=config["dropout"], attention_dropout_rate=config["attention_dropout"],
      max_len=config["max_position_embeddings"], share_embeddings=True, norm="pre",
      activation=convert.ACTIVATIONS[config["activation_function"]],
      scale_embedding=config["scale_embedding"], position_frequencies="fairseq",
      position_offset=config["pad_token_id"] + 1, decoder_start_id=decoder_start_id)


def _params(weights: dict, model_config: TransformerConfig, order: np.ndarray, pad: int,
            where: Path) -> dict:
  """The parameter tree; consumes `weights` (a tensor left over, or a tied copy that
  differs, is refused)."""
  shared = convert.take_tied(weights, EMBEDDINGS, where, "tie_word_embeddings=True")
  if shared.shape != (model_config.vocab_size, model_config.d_model):
    raise DataError(f"{where}: the embedding is {list(shared.shape)}, config.json says "
                    f"[{model_config.vocab_size}, {model_config.d_model}]")
  # Permuted into the padded rows in one allocation (NLLB's matrix is 1 GB).
  embedding = vocab_padding.take_rows(shared, order)
  del shared
  params: dict = {"shared_embedding": {"embedding": embedding}, "encoder": {}, "decoder": {}}
  rows = model_config.max_len + model_config.position_offset
  table = sinusoidal_position_encoding(rows, model_config.d_model, layout="halves",
                                       frequencies="fairseq")
  table[pad] = 0.0
  atol = 1e-6 + 2.0 ** -21 * np.arange(rows, dtype=np.float64)[:, None]  # As fsmt.py's.
  convert.check_positions(weights, table, where, atol=atol, what="fairseq's sinusoidal table")
  convert.bart_layers(weights, model_config, params)
  for side in ("encoder", "decoder"):
    norm = convert.layer_norm(weights, f"model.{side}.layer_norm")["norm"]
    params[side]["final_norm"] = norm
  if weights:
    raise DataError(f"{where}: tensors with no place in the model: {sorted(weights)[:5]}")
  return params
