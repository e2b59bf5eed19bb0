"""What every import shares: reading a transformers folder (config.json, model.safetensors;
safetensors' numpy API, no torch), the config-field table check, the vocabulary
permutation to the project's ids, the BART-family layer layout (Marian, FSMT), and
writing the workdir (run.json, the tokenizer's files, an orbax checkpoint).

An architecture's module (`marian`, `fsmt`) gives `import_folder(folder) -> Imported`;
`write_workdir` writes it. Problems are DataErrors naming the file and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import numpy as np

from flax_transformer import new_workdir, storage
from flax_transformer.errors import DataError
from flax_transformer.languages import Languages
from flax_transformer.network.activations import FROM_TRANSFORMERS
from flax_transformer.network.config import TransformerConfig
from flax_transformer.pretrained import tokenizers
# Keys of every transformers folder (PretrainedConfig's, PreTrainedTokenizerBase's).
from flax_transformer.pretrained.hub_keys import CONFIG_KEYS as GENERIC_IRRELEVANT
from flax_transformer.pretrained.hub_keys import TOKENIZER_KEYS as TOKENIZER_GENERIC
from flax_transformer.pretrained.hub_keys import Rule, must_be  # noqa: F401 (theirs)
from flax_transformer.workdir import TOKENIZER_DIR, Workdir, record_run

# How to make model.safetensors of a folder that has only torch's pickle.
CONVERT_BIN = ("python -c \"from transformers import AutoModelForSeq2SeqLM as M; "
               "M.from_pretrained('{folder}').save_pretrained('{folder}', "
               "safe_serialization=True)\" (with torch and transformers installed)")

@dataclasses.dataclass
class Imported:
  """A converted model: what `write_workdir` writes.

  params: the parameter tree (numpy float32) the config builds; tokenizer_spec: run.json's
  "tokenizer" entry (its "files" are written from `tokenizer_files`, name -> bytes);
  notes: what the import logged (fields accepted with a caveat).
  """

  architecture: str
  model_config: TransformerConfig
  params: Any
  tokenizer_spec: dict
  tokenizer_files: dict[str, bytes]
  notes: list[str] = dataclasses.field(default_factory=list)
  languages: Languages = Languages()  # run.json's "languages" (flax_transformer.languages).


def read_config_json(folder: Path) -> dict:
  """config.json of the transformers folder `folder`, as a dict."""
  path = folder / "config.json"
  if not folder.is_dir():
    raise DataError(f"--from={folder}: not a directory")
  if not path.is_file():
    raise DataError(f"{path} not found: a transformers model folder has config.json, "
                    "model.safetensors and its tokenizer's files")
  try:
    config = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: not JSON ({e})") from None
  if not isinstance(config, dict):
    raise DataError(f"{path}: not a JSON object")
  return config


def read_config(folder: Path, architecture: str, classes: tuple[str, ...]) -> dict:
  """config.json of `folder`, checked to be `architecture` (its model_type) and one of
  `classes` (its architectures, where given)."""
  path = folder / "config.json"
  config = read_config_json(folder)
  if config.get("model_type") != architecture:
    raise DataError(f"{path}: model_type {config.get('model_type')!r} is not {architecture!r}")
  named = config.get("architectures") or []
  if named and not set(named) & set(classes):
    raise DataError(f"{path}: architectures {named} has none of {list(classes)} (an "
                    "encoder-decoder model for translation)")
  return config


def read_weights(folder: Path) -> dict[str, np.ndarray]:
  """model.safetensors's tensors as float32 numpy arrays (no torch)."""
  path = folder / "model.safetensors"
  if not path.is_file():
    if (folder / "pytorch_model.bin").is_file():
      raise DataError(f"{folder} has pytorch_model.bin but no model.safetensors; this "
                      "import reads safetensors only (no torch). Convert it once: "
                      + CONVERT_BIN.format(folder=folder))
    raise DataError(f"{path} not found")
  from safetensors import SafetensorError
  from safetensors.numpy import load_file
  try:
    tensors = load_file(str(path))
  except (SafetensorError, OSError, ValueError) as e:
    raise DataError(f"{path}: not a readable safetensors file ({e})") from None
  weights = {name: np.asarray(value, np.float32) for name, value in tensors.items()}
  check_sizes(read_config_json(folder), weights, folder / "config.json")
  return weights


# config.json's widths and the BART-family tensor axis that has each: (field, tensor, axis).
SIZED_BY = (("d_model", "model.encoder.layers.0.fc1.weight", 1),
            ("encoder_ffn_dim", "model.encoder.layers.0.fc1.weight", 0),
            ("decoder_ffn_dim", "model.decoder.layers.0.fc1.weight", 0))


def check_sizes(config: Mapping, weights: Mapping[str, np.ndarray], where: Path) -> None:
  """The sizes config.json states are the weights' (widths, layer counts), before any is
  used to build something of that size (d_model=10**30 would be a numpy error deep in a
  table's construction, or petabytes): a DataError naming the field and the tensor."""
  for field, name, axis in SIZED_BY:
    tensor = weights.get(name)
    if field in config and tensor is not None and config[field] != tensor.shape[axis]:
      raise DataError(f"{where}: {field}={config[field]!r}, but {name} in model.safetensors "
                      f"is {' x '.join(map(str, tensor.shape))}")
  for side in ("encoder", "decoder"):
    prefix, field = f"model.{side}.layers.", f"{side}_layers"
    count = len({name[len(prefix):].split(".", 1)[0] for name in weights
                 if name.startswith(prefix)})
    if field in config and count and config[field] != count:
      raise DataError(f"{where}: {field}={config[field]!r}, but model.safetensors has "
                      f"{count} {side} layers")


def read_bytes(folder: Path, name: str) -> bytes:
  path = folder / name
  if not path.is_file():
    raise DataError(f"{path} not found (the tokenizer's file)")
  return path.read_bytes()


def read_json(folder: Path, name: str) -> Any:
  try:
    return json.loads(read_bytes(folder, name))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DataError(f"{folder / name}: not JSON ({e})") from None


def read_vocabulary(folder: Path, name: str, specials=("<pad>", "</s>", "<unk>")
                    ) -> dict[str, int]:
  """A vocabulary file (piece -> id, ids 0..n-1 each once, with every one of `specials`),
  or a DataError naming its problem."""
  return tokenizers.vocabulary_ids(folder / name, read_json(folder, name), specials)


def file_hashes(folder: Path) -> dict[str, str]:
  """sha256 of every file of `folder` (the run record's proof of what was imported), read
  in blocks: a whole model.safetensors read at once was a second copy of the model."""
  hashes = {}
  for path in sorted(folder.iterdir()):
    if path.is_file():
      digest = hashlib.sha256()
      with path.open("rb") as f:
        while block := f.read(1 << 24):
          digest.update(block)
      hashes[path.name] = digest.hexdigest()
  return hashes


def must_be_int(minimum: int) -> Rule:
  """A size: an integer of at least `minimum`."""
  return lambda value: None if isinstance(value, int) and not isinstance(value, bool) and (
      value >= minimum) else f"an integer >= {minimum}"


# activation_function (transformers' ACT2FN names) -> TransformerConfig.activation.
ACTIVATIONS = FROM_TRANSFORMERS  # network/activations.py's table, read backwards.
MAX_POSITIONS = 1 << 16  # A position table beyond it is a typo, not a model (memory).
TRAINING_ONLY = "training only (dropout, layer drop, initialisation): not the function"
# The fields MarianConfig and FSMTConfig (BART's family) share, as `check_fields` reads
# them: the architecture's `model_config_from` maps those with rules.
BART_FIELDS: dict = {
    "d_model": must_be_int(1), "encoder_layers": must_be_int(1),
    "decoder_layers": must_be_int(1), "encoder_ffn_dim": must_be_int(1),
    "decoder_ffn_dim": must_be_int(1), "encoder_attention_heads": must_be_int(1),
    "decoder_attention_heads": must_be_int(1),
    "max_position_embeddings": lambda v: must_be_int(1)(v) or (
        None if v <= MAX_POSITIONS else f"at most {MAX_POSITIONS}"),
    "activation_function": lambda v: None if v in ACTIVATIONS else f"one of {sorted(ACTIVATIONS)}",
    "scale_embedding": must_be(True, False), "tie_word_embeddings": must_be(True, False),
    "pad_token_id": lambda v: None, "eos_token_id": lambda v: None,  # Checked with the vocabulary.
    "decoder_start_token_id": lambda v: None,
    "is_encoder_decoder": must_be(True),
    "dropout": lambda v: None, "attention_dropout": lambda v: None,  # Fine-tuning's rates.
    "activation_dropout": TRAINING_ONLY, "encoder_layerdrop": TRAINING_ONLY,
    "decoder_layerdrop": TRAINING_ONLY, "init_std": TRAINING_ONLY,
}

def training_only_notes(config: Mapping) -> list[str]:
  """The run record's notes on nonzero training-only rates (not applied here)."""
  return [f"{name}={config[name]}: {TRAINING_ONLY}" for name in (
      "activation_dropout", "encoder_layerdrop", "decoder_layerdrop") if config.get(name)]


def check_fields(config: Mapping, table: Mapping[str, Rule | str], where: Path) -> None:
  """Every field of `config` is in `table` (or GENERIC_IRRELEVANT): a rule (value -> None,
  or what this code implements) for fields that change the function, a reason for those
  that do not. A field in neither, or a value a rule refuses, is a DataError naming it."""
  if not isinstance(config, Mapping):
    raise DataError(f"{where}: not a JSON object of fields")
  for name, value in config.items():
    rule = table.get(name, GENERIC_IRRELEVANT.get(name))
    if rule is None:
      raise DataError(f"{where}: field {name!r} (= {value!r}) has no equivalent here and is "
                      "not known to leave the model's function unchanged")
    if callable(rule) and (problem := rule(value)) is not None:
      raise DataError(f"{where}: {name}={value!r} has no equivalent here ({problem})")


def project_order(size: int, *, pad: int, eos: int, unk: int | None = None) -> np.ndarray:
  """int [size]: new id i is old id order[i]. pad -> 0, EOS -> 1, unk -> 2 (the project's
  ids), the other ids in their old order after them."""
  first = [pad, eos] + ([unk] if unk is not None else [])
  if len(set(first)) != len(first) or not all(0 <= i < size for i in first):
    raise DataError(f"pad {pad}, EOS {eos} and unknown {unk} must be distinct ids below {size}")
  chosen = set(first)
  return np.asarray(first + [i for i in range(size) if i not in chosen], np.int64)


def permuted_vocab(vocab: Mapping[str, int], order: np.ndarray) -> dict[str, int]:
  """A piece -> id table in the new ids (`order` from `project_order`)."""
  new_id = np.empty_like(order)
  new_id[order] = np.arange(len(order))
  return {piece: int(new_id[i]) for piece, i in sorted(vocab.items(), key=lambda kv: kv[1])}


def linear(weights: Mapping[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
  """torch Linear `name` -> (kernel [in, out], bias [out]). The kernel is copied into C
  order here, one tensor at a time: a transposed view made the checkpoint write copy every
  kernel at once (1.3 GB more at the peak of an NLLB-600M import)."""
  return (np.ascontiguousarray(take(weights, f"{name}.weight").T),
          take(weights, f"{name}.bias"))


def take(weights: Mapping[str, np.ndarray], name: str) -> np.ndarray:
  if name not in weights:
    raise DataError(f"model.safetensors has no tensor {name!r}")
  return weights.pop(name) if isinstance(weights, dict) else weights[name]


def take_tied(weights: dict, names: tuple[str, ...], where: Path, why: str) -> np.ndarray:
  """The one matrix `names` are tied to, from whichever of them `weights` holds (a
  safetensors conversion keeps one name of each tied set, whichever it likes; fairseq and
  older transformers save every one): all are popped, and one that differs from the first
  present is refused, `why` saying what ties them."""
  present = [name for name in names if name in weights]
  if not present:
    raise DataError(f"{where}: model.safetensors has none of {', '.join(names)}")
  first, matrix = present[0], weights.pop(present[0])
  for name in present[1:]:
    if not np.array_equal(weights.pop(name), matrix):
      raise DataError(f"{where}: {name} differs from {first}, which {why} ties it to")
  return matrix


def bart_attention(weights: dict, prefix: str, heads: int) -> dict:
  """q/k/v/out_proj of a BART-family attention -> this project's MultiHeadAttention
  params (kernels [D, N, H] and [N, H, D]; heads split as transformers' view does)."""
  out = {}
  for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    kernel, bias = linear(weights, f"{prefix}.{theirs}")
    out[ours] = {"kernel": kernel.reshape(kernel.shape[0], heads, -1),
                 "bias": bias.reshape(heads, -1)}
  kernel, bias = linear(weights, f"{prefix}.out_proj")
  out["out"] = {"kernel": kernel.reshape(heads, -1, kernel.shape[1]), "bias": bias}
  return out


def layer_norm(weights: dict, name: str) -> dict:
  return {"norm": {"scale": take(weights, f"{name}.weight"), "bias": take(weights, f"{name}.bias")}}


def bart_ffn(weights: dict, prefix: str) -> dict:
  (k1, b1), (k2, b2) = linear(weights, f"{prefix}.fc1"), linear(weights, f"{prefix}.fc2")
  return {"w1": {"kernel": k1, "bias": b1}, "w2": {"kernel": k2, "bias": b2}}


def bart_encoder_layer(weights: dict, prefix: str, heads: int) -> dict:
  """A post-norm BART-family encoder layer (self_attn, fc1/fc2, their layer norms)."""
  return {"self_attention": bart_attention(weights, f"{prefix}.self_attn", heads),
          "attention_block": layer_norm(weights, f"{prefix}.self_attn_layer_norm"),
          "ffn": bart_ffn(weights, prefix),
          "ffn_block": layer_norm(weights, f"{prefix}.final_layer_norm")}


def bart_decoder_layer(weights: dict, prefix: str, heads: int) -> dict:
  """A post-norm BART-family decoder layer (self_attn, encoder_attn, fc1/fc2)."""
  return {"self_attention": bart_attention(weights, f"{prefix}.self_attn", heads),
          "self_attention_block": layer_norm(weights, f"{prefix}.self_attn_layer_norm"),
          "cross_attention": bart_attention(weights, f"{prefix}.encoder_attn", heads),
          "cross_attention_block": layer_norm(weights, f"{prefix}.encoder_attn_layer_norm"),
          "ffn": bart_ffn(weights, prefix),
          "ffn_block": layer_norm(weights, f"{prefix}.final_layer_norm")}


def bart_layers(weights: dict, model_config: TransformerConfig, params: dict) -> None:
  """Every encoder and decoder layer of `weights` (BART's names) into `params`' sides."""
  for side, count, layer in (("encoder", model_config.encoder_layers, bart_encoder_layer),
                             ("decoder", model_config.decoder_layers, bart_decoder_layer)):
    for i in range(count):
      params[side][f"layer_{i}"] = layer(weights, f"model.{side}.layers.{i}",
                                         model_config.num_heads)


def check_positions(weights: dict, table: np.ndarray, where: Path, *, atol,
                    what: str) -> None:
  """Takes each side's stored position table out of `weights`; one that is not `table` (on
  the rows both have, within `atol`: a float, or one per row [rows, 1]) is refused: the
  model computes `table`'s (`what`)."""
  for side in ("encoder", "decoder"):
    name = f"model.{side}.embed_positions.weight"
    stored = weights.pop(name, None)
    if stored is None:
      continue
    rows = min(len(stored), len(table))
    tolerance = np.broadcast_to(np.asarray(atol, np.float64), (len(table), 1))[:rows]
    if stored.shape[1:] != table.shape[1:] or not np.allclose(stored[:rows], table[:rows],
                                                                atol=tolerance):
      raise DataError(f"{where}: {name} is not {what}")


def check_tree(params: Any, model_config: TransformerConfig) -> None:
  """The converted tree is exactly the one `model_config` builds (names and shapes), so a
  checkpoint of it loads wherever the config's model does."""
  from flax_transformer.network.model import abstract_params
  want = {jax.tree_util.keystr(p): leaf.shape
          for p, leaf in jax.tree_util.tree_flatten_with_path(abstract_params(model_config))[0]}
  have = {jax.tree_util.keystr(p): np.shape(leaf)
          for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  if want != have:
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    shapes = [f"{k}: {have[k]} vs {want[k]}" for k in sorted(set(want) & set(have))
              if have[k] != want[k]]
    raise DataError(f"the converted parameters do not fit the model config: missing "
                    f"{missing[:3]}, unexpected {extra[:3]}, shapes {shapes[:3]}")


def write_workdir(imported: Imported, workdir: str | Path, source: Path) -> None:
  """A workdir every command reads: run.json (with "tokenizer" and "imported_from": the
  folder, its files' sha256), the tokenizer's files under tokenizer/, and the parameters
  as the orbax checkpoint of step 0 ({'params': ...}, as train.py's state holds them).
  Written whole or not at all, by one import (`new_workdir`)."""
  check_tree(imported.params, imported.model_config)
  new_workdir.create(workdir, lambda into: _fill_workdir(imported, into, source))
  logging.info("Imported %s from %s into %s", imported.architecture, source, workdir)


def _fill_workdir(imported: Imported, workdir: Workdir, source: Path) -> None:
  """`write_workdir`'s files, written into `workdir` (new_workdir's staging folder, or
  the bucket's workdir it holds), run.json last: in a bucket, the mark of a whole one."""
  from flax_transformer.checkpoints import Checkpointer
  folder = workdir.root / TOKENIZER_DIR
  folder.mkdir(parents=True, exist_ok=True)
  for name, data in imported.tokenizer_files.items():
    storage.write_atomically(folder / name, data)
  writer = Checkpointer(workdir, asynchronous=False, host_arrays_uncopied=True)
  try:
    writer.save(0, {"params": jax.tree_util.tree_map(np.asarray, imported.params)}, force=True)
    writer.wait()
  finally:
    writer.close()
  spec = {**imported.tokenizer_spec, "files": sorted(imported.tokenizer_files)}
  record_run(workdir, imported.model_config, imported.model_config.vocab_size, entries={
      "tokenizer": spec, "languages": imported.languages.to_json(),
      "imported_from": {"architecture": imported.architecture, "folder": str(source.absolute()),
                        "sha256": file_hashes(source), "notes": imported.notes}})
