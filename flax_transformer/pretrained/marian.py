"""Marian (OPUS-MT) models in the transformers format -> this project's Transformer.

transformers' MarianMTModel is a post-norm encoder-decoder with biases on every
projection, a `final_logits_bias`, sinusoidal positions with the sines in one half and
the cosines in the other (from position 0, the paper's frequencies), LayerNorm epsilon
1e-5 (torch's default), and ids with EOS 0 and pad last, the decoder starting from pad.
`FIELDS` says what each MarianConfig field becomes here, or why it does not change the
function; any other field, or a value this code does not implement, is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import sentencepiece as spm

from flax_transformer import languages
from flax_transformer.errors import DataError
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import sinusoidal_position_encoding
from flax_transformer.pretrained import bart_config
from flax_transformer.pretrained import convert, hub_keys, vocab_padding

ARCHITECTURE = "marian"
CLASSES = ("MarianMTModel",)
SHARED = "model.shared.weight"
ENCODER_EMBEDDING = "model.encoder.embed_tokens.weight"
DECODER_EMBEDDING = "model.decoder.embed_tokens.weight"
OUTPUT = "lm_head.weight"
# BART's config fields that transformers 3 wrote into OPUS-MT's config.json (the hub's
# 2020-21 uploads), with the value MarianMTModel computes: it reads none of them (its
# modeling code, in 4.57 as in 5.24), so any value loads there and computes that; the
# run record notes a value that says otherwise.
LEGACY = {"static_position_embeddings": True, "normalize_before": False,
          "normalize_embedding": False, "add_final_layer_norm": False,
          "add_bias_logits": False, "scale_attention": True}
# Every MarianConfig field: a rule (value -> None, or what this code implements) where it
# changes the function (`model_config` maps it), a reason where it does not. Fields of
# every transformers config are convert.GENERIC_IRRELEVANT's.
FIELDS: dict = {
    **convert.BART_FIELDS,
    "vocab_size": convert.must_be_int(1), "decoder_vocab_size": lambda v: None,
    "num_hidden_layers": lambda v: None,  # An alias of encoder_layers (checked equal).
    "share_encoder_decoder_embeddings": convert.must_be(True, False),
    **{name: "MarianMTModel ignores it (transformers 4 and 5); so does this import"
       for name in LEGACY},
    "extra_pos_embeddings": "transformers 3's offset of BART's learned positions: "
    "MarianMTModel ignores it (its positions are static)",
    "unk_token_id": "the tokenizer's: vocab.json's '<unk>' is taken",
}
# tokenizer_config.json: what MarianTokenizer does with each field here.
TOKENIZER_FIELDS: dict = {
    **convert.TOKENIZER_GENERIC,
    "separate_vocabs": convert.must_be(True, False, None),  # None: False, as there.
    "sp_model_kwargs": convert.must_be({}, None),
    "unk_token": hub_keys.special_token("<unk>"), "eos_token": hub_keys.special_token("</s>"),
    "pad_token": hub_keys.special_token("<pad>"),
    "source_lang": "names a Moses punctuation normaliser MarianTokenizer never calls",
    "target_lang": "as source_lang", "tokenizer_class": "checked",
    # Tokens kept whole: the specials only (the text is cut at them); an added one would
    # be cut out of sources too, which this tokenizer does not do.
    "added_tokens_decoder": lambda v: None if isinstance(v, dict) and all(
        isinstance(t, dict) and t.get("content") in ("</s>", "<unk>", "<pad>")
        for t in v.values()) else "only the special tokens '</s>', '<unk>', '<pad>'",
}


# manifest.json's format in a folder export.py --format=transformers wrote (export/marian.py).
EXPORTED = "flax_transformer.transformers/1"


def import_folder(folder: Path) -> convert.Imported:
  """The model, tokenizer and config of the transformers Marian folder `folder`."""
  config = convert.read_config(folder, ARCHITECTURE, CLASSES)
  convert.check_fields(config, FIELDS, folder / "config.json")
  tokenizer_config = convert.read_json(folder, "tokenizer_config.json") if (
      folder / "tokenizer_config.json").is_file() else {}
  convert.check_fields(tokenizer_config, TOKENIZER_FIELDS, folder / "tokenizer_config.json")
  _check_legacy_token_files(folder, tokenizer_config)
  shared = config.get("share_encoder_decoder_embeddings", True)
  if bool(tokenizer_config.get("separate_vocabs", not shared)) == shared:
    raise DataError(f"{folder}: tokenizer_config.json's separate_vocabs="
                    f"{tokenizer_config.get('separate_vocabs')} contradicts config.json's "
                    f"share_encoder_decoder_embeddings={shared}")
  notes = convert.training_only_notes(config) + [
      f"{name}={config[name]!r}: MarianMTModel ignores it and computes {value!r}, as here"
      for name, value in LEGACY.items() if name in config and config[name] != value]

  vocab_names = ("vocab.json",) if shared else ("vocab.json", "target_vocab.json")
  vocabs, orders, decoder_start_id = _vocabularies(folder, config, vocab_names)
  source_vocab, target_vocab = vocabs[0], vocabs[-1]
  source_order, target_order = orders[0], orders[-1]
  where = folder / "config.json"

  model_config = model_config_from(config, where, shared=shared,
                                   source_size=len(source_vocab), target_size=len(target_vocab),
                                   decoder_start_id=decoder_start_id)
  weights = convert.read_weights(folder)
  params, final_bias = _params(weights, model_config, config, source_order, target_order,
                               folder / "model.safetensors")
  model_config, padded = vocab_padding.padded_config(  # As _params padded the rows.
      model_config, len(target_vocab), None if shared else len(source_vocab))
  notes += padded
  if decoder_start_id == 0 and not any(np.any(row) for row in _padding_rows(params)):
    # OPUS-MT's converter adds the padding row as zeros (Marian-NMT starts from a zero
    # vector): held at zero, a fine-tuned model stays one CTranslate2 converts exactly.
    model_config = model_config.replace(start_from_zero_embedding=True)
    notes.append("the padding row is zeros: start_from_zero_embedding (held at zero)")
  if final_bias is None:
    notes.append("final_logits_bias is absent or 0: the model has none")
  else:
    model_config = model_config.replace(final_logits_bias=True)
    params["decoder"]["final_logits_bias"] = final_bias

  files = _tokenizer_files(folder, vocab_names, vocabs, orders)
  return convert.Imported(ARCHITECTURE, model_config, params,
                          {"kind": "marian", "separate_vocabularies": not shared, **(
                              {"clean_up_tokenization_spaces": True} if tokenizer_config.get(
                                  "clean_up_tokenization_spaces") else {})}, files, notes,
                          _languages(folder, source_vocab, tokenizer_config))


def _languages(folder: Path, pieces, tokenizer_config: dict) -> languages.Languages:
  """The folder's languages: the record export.py wrote into its manifest.json (a model
  trained here on several languages, told its target by '<2de>' forced first, which no
  file of transformers' states), else its >>xx<< tags or its tokenizer_config's pair."""
  if (folder / "manifest.json").is_file():
    try:
      manifest = convert.read_json(folder, "manifest.json")
    except DataError:  # Not JSON: another tool's file (export.py's is JSON), not read.
      manifest = None
    if isinstance(manifest, dict) and manifest.get("format") == EXPORTED and (
        "languages" in manifest):
      return languages.Languages.from_json(manifest["languages"], str(folder / "manifest.json"))
  return languages.from_marian(pieces, tokenizer_config)


def _check_legacy_token_files(folder: Path, tokenizer_config: dict) -> None:
  """A tokenizer_config.json without "added_tokens_decoder" (saved before transformers
  4.34, as the hub's OPUS-MT uploads are) leaves the special tokens to
  special_tokens_map.json and the added ones to added_tokens.json, which MarianTokenizer
  then reads (4.57 and 5.24): their tokens are checked as tokenizer_config.json's are,
  and an added token (cut out of sources there, not here) is refused in one line."""
  if "added_tokens_decoder" in tokenizer_config:
    return  # transformers reads neither file then.
  if (folder / "special_tokens_map.json").is_file():
    convert.check_fields(convert.read_json(folder, "special_tokens_map.json"),
                         TOKENIZER_FIELDS, folder / "special_tokens_map.json")
  if (folder / "added_tokens.json").is_file():
    added = convert.read_json(folder, "added_tokens.json")
    if added not in ({}, None):
      raise DataError(f"{folder / 'added_tokens.json'}: added tokens "
                      f"{sorted(added) if isinstance(added, dict) else added!r} have no "
                      "equivalent here (MarianTokenizer cuts their text out of sources; "
                      "only '</s>', '<unk>', '<pad>' are cut here)")


def _vocabularies(folder: Path, config: dict, vocab_names: tuple[str, ...]):
  """(the vocabulary files' tables, each one's order of project ids, the decoder start's
  new id), each table checked against config.json's sizes and special ids."""
  vocabs = [convert.read_vocabulary(folder, name) for name in vocab_names]
  source_vocab, target_vocab = vocabs[0], vocabs[-1]
  where = folder / "config.json"
  sizes = (config.get("vocab_size", 58101), config.get("decoder_vocab_size")
           or config.get("vocab_size", 58101))
  for vocab, size, name in ((source_vocab, sizes[0], "vocab_size"),
                            (target_vocab, sizes[1], "decoder_vocab_size")):
    if len(vocab) != size:
      raise DataError(f"{where}: {name}={size}, but the vocabulary file has {len(vocab)} pieces")
  pad, eos = config.get("pad_token_id", 58100), config.get("eos_token_id", 0)
  for piece, value, name in (("<pad>", pad, "pad_token_id"), ("</s>", eos, "eos_token_id")):
    if target_vocab.get(piece) != value:
      raise DataError(f"{where}: {name}={value}, but {vocab_names[-1]} has {piece!r} at "
                      f"{target_vocab.get(piece)}")
  orders = [convert.project_order(len(v), pad=v["<pad>"], eos=v["</s>"], unk=v["<unk>"])
            for v in vocabs]
  start = config.get("decoder_start_token_id", pad)
  if not 0 <= start < len(target_vocab):
    raise DataError(f"{where}: decoder_start_token_id={start} is not a target id")
  return vocabs, orders, int(np.argsort(orders[-1])[start])


def _tokenizer_files(folder: Path, vocab_names, vocabs, orders) -> dict[str, bytes]:
  """The workdir's tokenizer/: the two sentencepiece models (checked), the vocabularies
  in the project's ids, filled to the model's padded rows (vocab_padding)."""
  files = {name: convert.read_bytes(folder, name) for name in ("source.spm", "target.spm")}
  for name, data in files.items():
    try:
      spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as e:
      raise DataError(f"{folder / name}: not a sentencepiece model ({e})") from None
  for name, vocab, order in zip(vocab_names, vocabs, orders):
    permuted = vocab_padding.fill_rows(convert.permuted_vocab(vocab, order),
                                       vocab_padding.padded_rows(len(vocab)), folder / name)
    files[name] = json.dumps(permuted, ensure_ascii=False, indent=0).encode()
  return files


def model_config_from(config: dict, where: Path, *, shared: bool, source_size: int,
                      target_size: int, decoder_start_id: int) -> TransformerConfig:
  """The TransformerConfig of a MarianConfig (as its config.json holds it)."""
  tied = config.get("tie_word_embeddings", True)
  if shared and not tied:
    raise DataError(f"{where}: tie_word_embeddings=False with shared embeddings has no "
                    "equivalent here (an output matrix apart from one shared embedding)")
  return bart_config.model_config_from(
      config, where, vocab_size=target_size, source_vocab_size=None if shared else source_size,
      d_model=config.get("d_model", 1024), d_ff=config.get("encoder_ffn_dim", 4096),
      num_heads=config.get("encoder_attention_heads", 16),
      num_layers=config.get("encoder_layers", 12),
      num_decoder_layers=config.get("decoder_layers", 12),
      dropout_rate=config.get("dropout", 0.1),
      attention_dropout_rate=config.get("attention_dropout", 0.0),
      max_len=config.get("max_position_embeddings", 1024), share_embeddings=shared,
      tie_target_embedding=not shared and tied, norm="post",
      activation=convert.ACTIVATIONS[config.get("activation_function", "gelu")],
      scale_embedding=config.get("scale_embedding", False), decoder_start_id=decoder_start_id)


def _padding_rows(params: dict) -> list[np.ndarray]:
  """The target side's rows for id 0 (padding): its embedding's and the pre-softmax
  matrix's."""
  embedding = params.get("shared_embedding", params.get("target_embedding"))["embedding"]
  logits = params["decoder"].get("logits")
  return [embedding[0]] + ([] if logits is None else [logits["kernel"][:, 0]])


def _params(weights: dict, model_config: TransformerConfig, config: dict,
            source_order: np.ndarray, target_order: np.ndarray, where: Path):
  """(the parameter tree, final_logits_bias [V] permuted or None when absent or 0), each
  vocabulary's rows padded (vocab_padding.take_rows).
  Consumes `weights`; a tensor left over, or a tied copy that differs, is refused."""
  shared = model_config.share_embeddings
  params: dict = {"encoder": {}, "decoder": {}}
  if shared:  # transformers ties all four names to one matrix.
    target = convert.take_tied(weights, (SHARED, ENCODER_EMBEDDING, DECODER_EMBEDDING, OUTPUT),
                               where, "share_encoder_decoder_embeddings=True")
    params["shared_embedding"] = {"embedding": vocab_padding.take_rows(target, target_order)}
  else:
    source = convert.take(weights, ENCODER_EMBEDDING)
    if model_config.tie_target_embedding:
      target = convert.take_tied(weights, (DECODER_EMBEDDING, OUTPUT), where,
                                 "tie_word_embeddings=True")
    else:
      target = convert.take(weights, DECODER_EMBEDDING)
      params["decoder"]["logits"] = {"kernel": vocab_padding.take_rows(
          convert.take(weights, OUTPUT), target_order).T}
    params["source_embedding"] = {"embedding": vocab_padding.take_rows(source, source_order)}
    params["target_embedding"] = {"embedding": vocab_padding.take_rows(target, target_order)}
  table = sinusoidal_position_encoding(model_config.max_len, model_config.d_model,
                                       layout="halves")
  convert.check_positions(weights, table, where, atol=1e-6,
                          what="transformers' sinusoidal table")
  convert.bart_layers(weights, model_config, params)
  bias = weights.pop("final_logits_bias", None)
  if bias is not None:
    bias = bias.reshape(-1)
    if bias.shape != (model_config.vocab_size,):
      raise DataError(f"{where}: final_logits_bias has {bias.size} entries, not the target "
                      f"vocabulary's {model_config.vocab_size}")
    bias = vocab_padding.take_rows(bias, target_order) if np.any(bias) else None
  if weights:
    raise DataError(f"{where}: tensors with no place in the model: {sorted(weights)[:5]}")
  return params, bias
