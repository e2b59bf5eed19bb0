"""An imported M2M100 / NLLB-200 workdir as a transformers M2M100ForConditionalGeneration
folder (export.py --format=transformers), the inverse of pretrained/m2m100.py.

Files: config.json and generation_config.json (M2M100Config, GenerationConfig),
model.safetensors, the tokenizer's files (sentencepiece.bpe.model, and M2M100Tokenizer's
vocab.json or NllbTokenizer's added tokens, with tokenizer_config.json), and ours:
manifest.json. No torch needed: numpy and safetensors write it.

What the import did, undone:
- Ids. The import moved transformers' fairseq ids (<s> 0, <pad> 1, </s> 2, <unk> 3) to
  the project's (pad 0, EOS 1, unknown 2; `convert.project_order`, with the other ids in
  their old order): our id k is transformers' order[k]. The embedding's rows go back.
- Padding. config.vocab_padding rows (never produced) were added for sharding: dropped.
- The rest is fairseq's pre-norm transformer as transformers has it: the LayerNorms
  before each sublayer (self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm)
  and each stack's final one (layer_norm), biases everywhere (zeros where ours has none),
  fairseq's sinusoid (recomputed at load: not in the file, so refused unless ours is it),
  one shared embedding (tied to the output projection), no logits bias.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flax_transformer.errors import ConfigError
from flax_transformer.export import bart, layout
from flax_transformer.languages import Languages
from flax_transformer.network import config_fields
from flax_transformer.network.activations import ACTIVATIONS
from flax_transformer.network.config import TransformerConfig

FORMAT = "flax_transformer.transformers-m2m100/1"
ARCHITECTURE = "M2M100ForConditionalGeneration"  # config.json's; export.py names it.
LOADED_BY = "AutoModelForSeq2SeqLM.from_pretrained and AutoTokenizer.from_pretrained"
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which M2M100's layers keep.
FAIRSEQ_IDS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}  # m2m100_tokenizer.SPECIALS.
# NllbTokenizer's added tokens (AddedToken's flags); its '<mask>' takes the space before it
# and is normalized (its __init__'s, transformers 4.57 and 5), the others are taken as is.
ADDED_TOKEN = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
               "special": True}
MASK_TOKEN = {"lstrip": True, "normalized": True}
# The computed config fields (network/config_fields.py) this export writes; any other away
# from its default is refused, named.
MAPPED = {"vocab_size", "vocab_padding", "d_model", "d_ff", "num_heads", "d_k", "d_v",
          "num_layers", "num_encoder_layers", "num_decoder_layers", "max_len",
          "share_embeddings", "attention_bias", "positional", "norm", "layer_norm_epsilon",
          "activation", "scale_embedding", "position_layout", "position_frequencies",
          "position_offset", "decoder_start_id"}


def check(config: TransformerConfig) -> None:
  """ConfigError naming what M2M100 cannot express, before anything is written."""
  if problem := config_fields.refusal(config, MAPPED, "--format=transformers",
                                      "transformers' M2M100 export"):
    raise ConfigError(problem)
  wanted = {"norm": "pre", "positional": "sinusoidal", "position_layout": "halves",
            "position_frequencies": "fairseq", "share_embeddings": True,
            "position_offset": FAIRSEQ_IDS["<pad>"] + 1,
            "layer_norm_epsilon": LAYER_NORM_EPSILON}
  for field, value in wanted.items():
    if getattr(config, field) != value:
      raise ConfigError(f"--format=transformers: M2M100 needs {field}={value!r}; this model "
                        f"has {getattr(config, field)!r}")
  if config.head_dim_k * config.num_heads != config.d_model or (
      config.head_dim_k != config.head_dim_v):
    raise ConfigError(f"--format=transformers: M2M100 needs d_k = d_v = d_model / num_heads; "
                      f"this model has d_k={config.head_dim_k}, d_v={config.head_dim_v}, "
                      f"d_model={config.d_model}, num_heads={config.num_heads}")


def rows(config: TransformerConfig) -> int:
  """The tokenizer's rows: the model's without the import's padding."""
  return config.vocab_size - config.vocab_padding


def vocabulary_order(config: TransformerConfig) -> np.ndarray:
  """int [rows]: our id k is transformers' id order[k] (the import's permutation)."""
  from flax_transformer.pretrained import convert
  return convert.project_order(rows(config), pad=FAIRSEQ_IDS["<pad>"],
                               eos=FAIRSEQ_IDS["</s>"], unk=FAIRSEQ_IDS["<unk>"])


def _tensors(config: TransformerConfig, model: layout.Model) -> dict[str, np.ndarray]:
  """M2M100ForConditionalGeneration's state dict (the positions are recomputed at load)."""
  out = bart.layer_tensors(model)
  theirs = np.empty((rows(config), config.d_model), np.float32)
  theirs[vocabulary_order(config)] = model.encoder.embedding[:rows(config)]
  out["model.shared.weight"] = theirs  # Tied: both stacks' embed_tokens and lm_head.
  return out


def special_ids(config: TransformerConfig) -> dict[str, int]:
  start = int(vocabulary_order(config)[config.decoder_start_id])
  return {"bos_token_id": FAIRSEQ_IDS["<s>"], "pad_token_id": FAIRSEQ_IDS["<pad>"],
          "eos_token_id": FAIRSEQ_IDS["</s>"], "decoder_start_token_id": start}


def m2m100_config(config: TransformerConfig) -> dict[str, Any]:
  """config.json: M2M100Config's fields."""
  return {
      "architectures": [ARCHITECTURE], "model_type": "m2m_100",
      "vocab_size": rows(config), "d_model": config.d_model,
      "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
      "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
      "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
      "activation_function": ACTIVATIONS[config.activation].transformers[0],
      "max_position_embeddings": config.max_len, "scale_embedding": config.scale_embedding,
      "tie_word_embeddings": True, "dropout": config.dropout_rate,
      "attention_dropout": config.attention_dropout_rate, "activation_dropout": 0.0,
      "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, **special_ids(config),
      "is_encoder_decoder": True, "dtype": "float32"}


def generation_config(config: TransformerConfig, search: dict[str, Any]) -> dict[str, Any]:
  """generation_config.json: the search's settings; the target (forced_bos_token_id) is
  per call, as the source folder's. As our search: padding never produced, EOS forced at
  the length limit."""
  ids = special_ids(config)
  return {**ids, "bad_words_ids": [[ids["pad_token_id"]]],
          "forced_eos_token_id": ids["eos_token_id"], "num_beams": search["beam_size"],
          "length_penalty": search["alpha"], "max_length": config.max_len}


def _by_theirs(config: TransformerConfig, tokenizer) -> list[str]:
  """The piece of each transformers id (the workdir's vocabulary, ids put back)."""
  side = tokenizer.source
  if side.vocab_size != config.vocab_size:
    raise ConfigError(f"--format=transformers: the model has {config.vocab_size} ids, its "
                      f"vocabulary {side.vocab_size}")
  pieces = side.pieces(range(rows(config)))
  theirs = [""] * rows(config)
  for ours, t in enumerate(vocabulary_order(config)):
    theirs[t] = pieces[ours]
  return theirs


def tokenizer_files(config: TransformerConfig, tokenizer) -> dict[str, Any]:
  """The source folder's tokenizer files, rebuilt from the workdir's (its sentencepiece
  model, its vocabulary in our ids and run.json's spec)."""
  spec = getattr(tokenizer, "spec", None) or {}
  if spec.get("kind") != "m2m100":
    raise ConfigError(f"--format=transformers: this workdir's tokenizer ({spec.get('kind')}) "
                      "is not an imported M2M100/NLLB one")
  pieces = [p for p in _by_theirs(config, tokenizer) if not p.startswith("<unused_")]
  codes = list(spec["language_tokens"])
  common = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
            "pad_token": "<pad>", "unk_token": "<unk>",
            "clean_up_tokenization_spaces": bool(spec.get("clean_up_tokenization_spaces"))}
  files: dict[str, Any] = {"sentencepiece.bpe.model": (
      Path(tokenizer.path) / "sentencepiece.bpe.model").read_bytes()}
  if spec["tokenizer_class"] == "M2M100Tokenizer":
    first_code = pieces.index(codes[0])
    madeup = sum(p.startswith("madeupword") for p in pieces)
    names = {c: c.strip("_") for c in codes}
    lists = {"m2m100": 100, "wmt21": 8}
    files["vocab.json"] = {p: i for i, p in enumerate(pieces[:first_code])}
    files["tokenizer_config.json"] = {
        **common, "tokenizer_class": "M2M100Tokenizer", "num_madeup_words": madeup,
        "language_codes": next(k for k, n in lists.items() if n == len(codes)),
        "src_lang": names.get(spec.get("default_source_token"), "en"),
        "sp_model_kwargs": {}}
    return files
  files["tokenizer_config.json"] = {
      **common, "tokenizer_class": "NllbTokenizer", "mask_token": "<mask>",
      "additional_special_tokens": codes, "src_lang": spec.get("default_source_token"),
      "legacy_behaviour": not spec.get("source_language_first", True),
      "added_tokens_decoder": {
          str(i): {"content": p, **ADDED_TOKEN, **(MASK_TOKEN if p == "<mask>" else {})}
          for i, p in enumerate(pieces) if p in FAIRSEQ_IDS or p in codes or p == "<mask>"}}
  return files


def convert(config: TransformerConfig, params: dict[str, Any], tokenizer, out_dir: str | Path,
            *, search: dict[str, Any], provenance: dict | None = None,
            languages: Languages | None = None) -> Path:
  """Writes an M2M100ForConditionalGeneration folder to `out_dir` (the module's docstring).
  search: beam_size, alpha (generation_config.json's num_beams, length_penalty).
  languages: the workdir's record, into manifest.json."""
  from safetensors.numpy import save

  check(config)
  files = tokenizer_files(config, tokenizer)
  files["config.json"] = m2m100_config(config)
  files["generation_config.json"] = generation_config(config, search)
  tensors = _tensors(config, layout.unpack(config, params))
  files["model.safetensors"] = save(tensors, metadata={"format": "pt"})
  return bart.write_folder(out_dir, files, {"format": FORMAT, "max_len": config.max_len,
                                            "search": search, **bart.languages_entry(languages),
                                            **(provenance or {})})
