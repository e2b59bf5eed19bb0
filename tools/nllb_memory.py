"""NLLB-200 1.3B and 3.3B on a mesh of 8 devices: the memory each device holds, from the
project's own sizing (an estimate from the shapes, not a measurement; nothing is allocated).

python -m tools.nllb_memory --json results/bench/nllb_memory.json

The models: transformers' config.json shapes of facebook/nllb-200-1.3B and -3.3B (d_model,
24+24 layers, d_ff 8192, 16 heads, 256,206 ids) as import_model.py makes them
(pretrained/m2m100.model_config_from, the vocabulary padded by vocab_padding.padded_config);
their parameter count checked against the published name. For each mesh (fsdp x tensor, the
default logical-axis rules of configs/default.py):
- fine-tuning: the train state one device holds as training/steps.Trainer places it (its
  shardings of the parameters and Adam's two moments, read off its abstract state), plus
  one gradient of the parameters' size and placement; with float32 parameters, and with
  bf16 ones (model.param_dtype=bfloat16: optax keeps Adam's moments in the parameters'
  dtype). Activations are not in it: the project has no estimate of them (train.py's
  log line reports the device's peak);
- inference (beam 4): the parameters one device holds (bf16, as placed above) plus
  translation/search_memory.search_bytes, the lower bound decode.py checks a search
  against, for the rows of a batch one device's data-parallel share holds (BATCH sentences
  of WIDTH tokens over the fsdp axis), counted whole on each device (the estimate splits
  no cache over the tensor axis).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

# Eight CPU devices stand for the mesh's (only shapes and shardings are read, nothing is
# allocated); set before jax starts.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from tools.common import command_line, parser, print_table, write_json  # noqa: E402

GIB = 2 ** 30
# transformers' config.json of each model (the fields that differ from M2M100Config's
# defaults), and the size its name publishes.
MODELS = {
    "NLLB-200 1.3B": ({"d_model": 1024, "encoder_layers": 24, "decoder_layers": 24,
                       "encoder_ffn_dim": 8192, "decoder_ffn_dim": 8192,
                       "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                       "vocab_size": 256206}, 1.3e9),
    "NLLB-200 3.3B": ({"d_model": 2048, "encoder_layers": 24, "decoder_layers": 24,
                       "encoder_ffn_dim": 8192, "decoder_ffn_dim": 8192,
                       "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                       "vocab_size": 256206}, 3.3e9),
}
MESHES = ({"fsdp": 8, "tensor": 1}, {"fsdp": 4, "tensor": 2}, {"fsdp": 2, "tensor": 4})
BEAM, BATCH, WIDTH = 4, 64, 128  # Inference: BATCH sentences of WIDTH source tokens.


def model_config(fields: dict):
  """The TransformerConfig import_model.py makes of a config.json with `fields`."""
  from flax_transformer.pretrained import m2m100, vocab_padding

  config = {**m2m100.DEFAULTS, **fields}
  made = m2m100.model_config_from(config, Path("config.json"), decoder_start_id=1)
  return vocab_padding.padded_config(made, config["vocab_size"])[0]


def per_device(tree) -> int:
  """Bytes the first device holds of `tree` (ShapeDtypeStructs with shardings)."""
  return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
             for leaf in jax.tree_util.tree_leaves(tree))


def train_state(config, mesh_sizes: dict):
  """(the abstract train state's parameters, all of it) as training/steps.Trainer places
  them on `mesh_sizes`."""
  from configs import default
  from flax_transformer.training import sharding
  from flax_transformer.training.steps import Trainer

  mesh = sharding.make_mesh({"data": 1, **mesh_sizes})
  state = Trainer(config, default.get_config(), mesh).abstract_state
  return state.params, state


def row(name: str, fields: dict, published: float, mesh_sizes: dict) -> dict:
  from flax_transformer.translation import search_memory
  from flax_transformer.translation.search_config import SearchConfig

  f32 = model_config(fields)
  params, state = train_state(f32, mesh_sizes)
  count = sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))
  real = count - f32.vocab_padding * f32.d_model  # The padding rows are no parameters.
  bf16_params, bf16_state = train_state(f32.replace(param_dtype="bfloat16"), mesh_sizes)
  rows = BATCH // mesh_sizes["fsdp"]
  length = search_memory.decode_length(SearchConfig().max_extra, f32.max_len, WIDTH)
  search = search_memory.search_bytes([f32.replace(dtype="bfloat16")], rows=rows, beams=BEAM,
                                      width=WIDTH, length=length)
  return {
      "model": name, "d_model": f32.d_model, "layers": f"{f32.encoder_layers}+"
      f"{f32.decoder_layers}", "d_ff": f32.d_ff, "num_heads": f32.num_heads,
      "vocab_size": fields["vocab_size"], "padded_vocab_size": f32.vocab_size,
      "parameters": real, "published": published, "vs_published": real / published,
      "mesh": mesh_sizes, "devices": math.prod(mesh_sizes.values()),
      "train_f32_gib": (per_device(state) + per_device(params)) / GIB,
      "train_bf16_gib": (per_device(bf16_state) + per_device(bf16_params)) / GIB,
      "params_bf16_gib": per_device(bf16_params) / GIB,
      "search_rows": rows, "search_width": WIDTH, "search_length": length,
      "search_gib": search / GIB,
      "inference_bf16_gib": (per_device(bf16_params) + search) / GIB,
  }


def main():
  args = parser(__doc__).parse_args()
  rows = [row(name, fields, published, mesh) for name, (fields, published) in MODELS.items()
          for mesh in MESHES]
  print_table([{**r, "mesh": " x ".join(f"{k} {v}" for k, v in r["mesh"].items())}
               for r in rows],
              ["model", "parameters", "vs_published", "mesh", "train_f32_gib",
               "train_bf16_gib", "params_bf16_gib", "search_gib", "inference_bf16_gib"])
  write_json(args.json, {
      "what": "an estimate from the shapes (tools/nllb_memory.py's docstring), not a "
              "measurement", "command": command_line(), "jax": jax.__version__,
      "beam_size": BEAM, "batch": BATCH, "width": WIDTH, "rows": rows})


if __name__ == "__main__":
  np.set_printoptions(suppress=True)
  main()
