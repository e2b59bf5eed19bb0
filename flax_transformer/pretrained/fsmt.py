"""FSMT (fairseq's WMT19 models) in the transformers format -> this project's Transformer.

transformers' FSMTForConditionalGeneration is fairseq's transformer: post-norm, biases on
every projection, LayerNorm epsilon 1e-5 (torch's default; FSMTConfig has no field for
it), embeddings times sqrt(d_model) (`scale_embedding`), separate source and target
vocabularies (`vocab-src.json`, `vocab-tgt.json`), and fairseq's sinusoidal positions:
sines in one half and cosines in the other, frequencies 10000^(-i/(d_model/2 - 1)), token
j at row j + pad + 1 of the table (`position_offset`). The decoder starts from EOS
(`decoder_start_token_id`). The output projection is its own matrix
(`decoder.output_projection`; transformers 5 ties it only with tie_word_embeddings, which
ties all three); where it equals the target embedding the import ties them, and where the
file has none it is the target embedding, fairseq's and transformers 4's tying, with a
note. Ids are permuted to the project's (pad 0, EOS 1, unknown 2) on each side.

`FIELDS` says what each FSMTConfig field becomes here, or why it does not change the
function; any other field, or a value this code does not implement, is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flax_transformer.errors import DataError
from flax_transformer.languages import Languages
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.layers import sinusoidal_position_encoding
from flax_transformer.pretrained import bart_config
from flax_transformer.pretrained import convert, hub_keys, vocab_padding
from flax_transformer.pretrained.fsmt_tokenizer import FILES, SPECIALS, read_merges

ARCHITECTURE = "fsmt"
CLASSES = ("FSMTForConditionalGeneration",)
# FSMTConfig's defaults, for fields a config.json leaves out.
DEFAULTS = {"src_vocab_size": 42024, "tgt_vocab_size": 42024, "activation_function": "relu",
            "d_model": 1024, "max_position_embeddings": 1024, "encoder_ffn_dim": 4096,
            "encoder_layers": 12, "encoder_attention_heads": 16, "decoder_ffn_dim": 4096,
            "decoder_layers": 12, "decoder_attention_heads": 16, "attention_dropout": 0.0,
            "dropout": 0.1, "decoder_start_token_id": 2, "scale_embedding": True,
            "tie_word_embeddings": False, "pad_token_id": 1, "eos_token_id": 2}
DECODER_EMBEDDING = "model.decoder.embed_tokens.weight"
OUTPUT = "model.decoder.output_projection.weight"
ENCODER_EMBEDDING = "model.encoder.embed_tokens.weight"
# FSMTConfig's attribute_map: names config.json may also hold, each equal to its field.
ALIASES = {"num_attention_heads": "encoder_attention_heads", "hidden_size": "d_model",
           "vocab_size": "tgt_vocab_size", "num_hidden_layers": "encoder_layers"}


def _langs(value) -> str | None:
  ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)
  return None if ok else "a list of the source and target languages, e.g. ['en', 'de']"


# Every FSMTConfig field: a rule (value -> None, or what this code implements) where it
# changes the function (`model_config_from` maps it), a reason where it does not. Fields of
# every transformers config are convert.GENERIC_IRRELEVANT's.
FIELDS: dict = {
    **convert.BART_FIELDS,
    "langs": _langs,  # The tokenizer's Moses languages (checked equal to its own).
    "src_vocab_size": convert.must_be_int(1), "tgt_vocab_size": convert.must_be_int(1),
    **{alias: lambda v: None for alias in ALIASES},  # Checked equal to their fields.
    "decoder": "a legacy nested decoder config that FSMTConfig drops",
}
# tokenizer_config.json: what FSMTTokenizer does with each field here.
TOKENIZER_FIELDS: dict = {
    "langs": _langs, "do_lower_case": convert.must_be(True, False),
    "bos_token": hub_keys.special_token(SPECIALS[0]),
    "pad_token": hub_keys.special_token(SPECIALS[1]),
    "sep_token": hub_keys.special_token(SPECIALS[2]),
    "eos_token": hub_keys.special_token(SPECIALS[2], None),
    "unk_token": hub_keys.special_token(SPECIALS[3]),
    "tokenizer_class": convert.must_be("FSMTTokenizer"),
    # Tokens kept whole: the specials only (the text is split at them).
    "added_tokens_decoder": lambda v: None if isinstance(v, dict) and all(
        isinstance(t, dict) and t.get("content") in SPECIALS for t in v.values())
    else f"only the special tokens {list(SPECIALS)}",
    **convert.TOKENIZER_GENERIC,
}


def import_folder(folder: Path) -> convert.Imported:
  """The model, tokenizer and config of the transformers FSMT folder `folder`."""
  where = folder / "config.json"
  config = convert.read_config(folder, ARCHITECTURE, CLASSES)
  convert.check_fields(config, FIELDS, where)
  config = {**DEFAULTS, **config}
  tokenizer_config = convert.read_json(folder, "tokenizer_config.json")
  convert.check_fields(tokenizer_config, TOKENIZER_FIELDS, folder / "tokenizer_config.json")
  langs = tokenizer_config.get("langs")
  if langs is None or ("langs" in config and config["langs"] != langs):
    raise DataError(f"{folder / 'tokenizer_config.json'}: langs={langs!r}, but config.json "
                    f"has {config.get('langs')!r} (the source and target languages)")
  notes = convert.training_only_notes(config)

  vocabs = [convert.read_vocabulary(folder, name, SPECIALS) for name in FILES[:2]]
  pad, eos = config["pad_token_id"], config["eos_token_id"]
  for vocab, name, size in zip(vocabs, FILES, ("src_vocab_size", "tgt_vocab_size")):
    if len(vocab) != config[size]:
      raise DataError(f"{where}: {size}={config[size]}, but {name} has {len(vocab)} pieces")
    for piece, value, field in (("<pad>", pad, "pad_token_id"), ("</s>", eos, "eos_token_id")):
      if vocab[piece] != value:
        raise DataError(f"{where}: {field}={value}, but {name} has {piece!r} at {vocab[piece]}")
  orders = [convert.project_order(len(v), pad=pad, eos=eos, unk=v["<unk>"]) for v in vocabs]
  start = config["decoder_start_token_id"]
  if not isinstance(start, int) or not 0 <= start < len(vocabs[1]):
    raise DataError(f"{where}: decoder_start_token_id={start!r} is not a target id")
  decoder_start_id = int(np.argsort(orders[1])[start])

  model_config = model_config_from(config, where, source_size=len(vocabs[0]),
                                   target_size=len(vocabs[1]),
                                   decoder_start_id=decoder_start_id)
  if model_config.share_embeddings and not np.array_equal(*orders):
    raise DataError(f"{where}: tie_word_embeddings=True shares one embedding, but "
                    f"{FILES[0]} and {FILES[1]} put their special tokens at different ids")
  params, tied_target, note = _params(convert.read_weights(folder), model_config, *orders,
                                      pad, folder / "model.safetensors")
  model_config = model_config.replace(tie_target_embedding=tied_target)
  notes += [note] if note else []
  model_config, padded = vocab_padding.padded_config(  # As _params padded the rows.
      model_config, len(vocabs[1]), None if model_config.share_embeddings else len(vocabs[0]))
  notes += padded

  files = {name: json.dumps(vocab_padding.fill_rows(
      convert.permuted_vocab(vocab, order), vocab_padding.padded_rows(len(vocab)),
      folder / name), ensure_ascii=False, indent=0).encode()
           for name, vocab, order in zip(FILES[:2], vocabs, orders)}
  files["merges.txt"] = convert.read_bytes(folder, "merges.txt")
  try:
    read_merges(files["merges.txt"].decode("utf-8"))
  except UnicodeDecodeError as e:
    raise DataError(f"{folder / 'merges.txt'}: not UTF-8 text ({e})") from None
  spec = {"kind": "fsmt", "langs": list(langs),
          "do_lower_case": bool(tokenizer_config.get("do_lower_case", False)),
          **({"clean_up_tokenization_spaces": True} if tokenizer_config.get(
              "clean_up_tokenization_spaces") else {})}
  return convert.Imported(ARCHITECTURE, model_config, params, spec, files, notes,
                          Languages.one_pair(*langs))


def model_config_from(config: dict, where: Path, *, source_size: int, target_size: int,
                      decoder_start_id: int) -> TransformerConfig:
  """The TransformerConfig of an FSMTConfig (`config`: config.json over DEFAULTS)."""
  for alias, field in ALIASES.items():
    if alias in config and config[alias] != config[field]:
      raise DataError(f"{where}: {alias}={config[alias]} and {field}={config[field]} differ "
                      "(transformers reads the one as the other)")
  shared = config["tie_word_embeddings"]
  if shared and source_size != target_size:
    raise DataError(f"{where}: tie_word_embeddings=True ties the source ({source_size}) and "
                    f"target ({target_size}) embeddings, which need one size")
  pad = config["pad_token_id"]
  if not isinstance(pad, int) or pad < 0:
    raise DataError(f"{where}: pad_token_id={pad!r} is not an id")
  return bart_config.model_config_from(
      config, where, same=bart_config.SAME[:2], vocab_size=target_size,
      source_vocab_size=None if shared else source_size, d_model=config["d_model"],
      d_ff=config["encoder_ffn_dim"], num_heads=config["encoder_attention_heads"],
      num_layers=config["encoder_layers"], num_decoder_layers=config["decoder_layers"],
      dropout_rate=config["dropout"], attention_dropout_rate=config["attention_dropout"],
      max_len=config["max_position_embeddings"], share_embeddings=shared, norm="post",
      activation=convert.ACTIVATIONS[config["activation_function"]],
      scale_embedding=config["scale_embedding"], position_frequencies="fairseq",
      position_offset=pad + 1, decoder_start_id=decoder_start_id)


def _params(weights: dict, model_config: TransformerConfig, source_order: np.ndarray,
            target_order: np.ndarray, pad: int, where: Path):
  """(the parameter tree, whether the target embedding is the output projection, a note
  or None). Consumes `weights`; a tensor left over, or a tied copy that differs, is
  refused."""
  params: dict = {"encoder": {}, "decoder": {}}
  tied, note = False, None
  if model_config.share_embeddings:  # transformers ties all three to the decoder's.
    target = convert.take_tied(weights, (DECODER_EMBEDDING, OUTPUT, ENCODER_EMBEDDING), where,
                               "tie_word_embeddings=True")
    params["shared_embedding"] = {"embedding": vocab_padding.take_rows(target, target_order)}
  else:
    embeddings = {name: weights.pop(name) for name in (DECODER_EMBEDDING, OUTPUT, ENCODER_EMBEDDING)
                  if name in weights}
    if ENCODER_EMBEDDING not in embeddings:
      raise DataError(f"{where}: model.safetensors has no tensor {ENCODER_EMBEDDING!r}")
    target, output = embeddings.get(DECODER_EMBEDDING), embeddings.get(OUTPUT)
    if target is None and output is None:
      raise DataError(f"{where}: model.safetensors has neither {DECODER_EMBEDDING!r} nor "
                      f"{OUTPUT!r}")
    if target is None or output is None:
      tied = True
      note = (f"{OUTPUT if output is None else DECODER_EMBEDDING} is absent: the output "
              "projection is the target embedding (fairseq's and transformers 4's tying)")
      target = output if target is None else target
    elif np.array_equal(output, target):
      tied = True
    else:
      params["decoder"]["logits"] = {"kernel": vocab_padding.take_rows(output, target_order).T}
    params["source_embedding"] = {"embedding": vocab_padding.take_rows(
        embeddings[ENCODER_EMBEDDING], source_order)}
    params["target_embedding"] = {"embedding": vocab_padding.take_rows(target, target_order)}
  rows = model_config.max_len + model_config.position_offset
  table = sinusoidal_position_encoding(rows, model_config.d_model, layout="halves",
                                       frequencies="fairseq")
  table[pad] = 0.0  # fairseq zeroes the padding index's row (never used here).
  # transformers' frequencies come from torch's float32 exp, at times an ulp from numpy's;
  # row r's angles then differ by up to r ulps, so the tolerance grows with the row
  # (measured: 6.1e-5 at row 710 of transformers 5.24's 1026 x 1024 table, WMT19's size).
  atol = 1e-6 + 2.0 ** -21 * np.arange(rows, dtype=np.float64)[:, None]
  convert.check_positions(weights, table, where, atol=atol, what="fairseq's sinusoidal table")
  convert.bart_layers(weights, model_config, params)
  if weights:
    raise DataError(f"{where}: tensors with no place in the model: {sorted(weights)[:5]}")
  return params, tied, note
