"""The encoder and beam search of a trained model as serialized StableHLO (jax.export).

One module per batch shape: for every row width decode.py may use (multiples of
16 up to the model's max_len), the rows one device searches in a whole batch of
decode.py's with the same --batch_tokens and device count. decode.py gives a width
that its input fills less than once fewer rows (`batching.fitted_rows`); the runner
pads to the whole batch. A row's search does not depend on the rows beside it, so
the two agree line for line (tests/test_export.py checks it on test 2016 and on
inputs of a few sentences).
Parameters are arguments (params.npz), not constants: one copy on disk, shared
by every shape.

Directory written:
  manifest.json   format, shapes and their files, search settings, ids, provenance,
                  and every file written ("files": what export.py --overwrite replaces)
  search_<rows>x<width>.stablehlo   jax.export's serialized modules
  params.npz      the parameters, leaf i under "leaf_<i>" (the modules' argument order;
                  bfloat16 as its bits in uint16, the manifest's param_dtypes naming it)
  vocab.model     the sentencepiece vocabulary
  translate.py    the runner (`runner.py`): jax, numpy and sentencepiece only here
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.data.tokenizer import EOS_ID, PAD_ID
from flax_transformer.errors import ConfigError
from flax_transformer.export import write_manifest, write_vocabulary
from flax_transformer.export.runner import FORMAT
from flax_transformer.translation import batching
from flax_transformer.translation import search_memory
from flax_transformer.translation.programs import make_search_fn
from flax_transformer.translation.translator import Translator

LENGTH_MULTIPLE = 16  # batching.eval_batches' default: the widths decode.py compiles.


def shapes(max_len: int, *, batch_tokens: int, devices: int) -> list[tuple[int, int]]:
  """(rows per device, width) of every whole batch decode.py may search on `devices`
  devices."""
  widths = range(LENGTH_MULTIPLE, batching.bucket_length(max_len, LENGTH_MULTIPLE) + 1,
                 LENGTH_MULTIPLE)
  return [(batching.batch_rows(w, batch_tokens=batch_tokens, row_multiple=devices) // devices,
           w) for w in widths]


def _storable(x: np.ndarray) -> np.ndarray:
  """`x`, or for a dtype numpy's format cannot name (bfloat16 and ml_dtypes' others,
  which np.savez writes as raw |V2 records) its bits as unsigned integers."""
  return x if x.dtype.kind in "biufc" else x.view(f"uint{8 * x.dtype.itemsize}")


def export_stablehlo(translator: Translator, out_dir: str | Path, *, batch_tokens: int,
                     platforms: Sequence[str] = ("cpu",), provenance: dict | None = None
                     ) -> dict:
  """Writes `translator`'s model and beam search to `out_dir`; returns the manifest.

  batch_tokens: decode.py's --batch_tokens, which with the translator's device
  count fixes the batch shapes. platforms: jax.export lowering platforms
  ('cpu', 'cuda', 'tpu'); the runner needs one of them.
  """
  search = translator.search
  if search.temperature > 0:
    raise ConfigError("export: sampling (temperature > 0) is not exported; beam search "
                      "(or greedy, beam_size=1) is")
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  vocabulary = write_vocabulary(out, translator.tokenizer, translator.languages)  # Refuses first.
  leaves, treedef = jax.tree_util.tree_flatten(translator.params)
  # Run on a --platforms machine: bounded by its devices' memory, not this host's.
  bound = search_memory.export_bound(platforms)
  search_fn = make_search_fn(translator.model_configs, search, memory=bound)

  def translate(flat_params, inputs):
    """inputs int32 [rows, width] -> best hypothesis int32 [rows, L], its score float32 [rows]."""
    result = search_fn(jax.tree_util.tree_unflatten(treedef, flat_params), inputs,
                       jax.random.PRNGKey(0))  # Unused: beam and greedy search draw nothing.
    return result.sequences[:, 0], result.scores[:, 0]

  param_specs = [jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype) for x in leaves]
  entries = []
  for rows, width in shapes(translator.max_len, batch_tokens=batch_tokens,
                            devices=len(translator.devices)):
    start = time.perf_counter()
    exported = jax.export.export(jax.jit(translate), platforms=tuple(platforms))(
        param_specs, jax.ShapeDtypeStruct((rows, width), jnp.int32))
    name = f"search_{rows}x{width}.stablehlo"
    (out / name).write_bytes(exported.serialize())
    logging.info("Exported beam search for [%d, %d] in %.1f s (%s)", rows, width,
                 time.perf_counter() - start, name)
    entries.append({"rows": rows, "width": width, "file": name})
  arrays = [np.asarray(x) for x in leaves]
  np.savez(out / "params.npz", **{f"leaf_{i}": _storable(x) for i, x in enumerate(arrays)})
  shutil.copyfile(Path(__file__).with_name("runner.py"), out / "translate.py")
  manifest = {
      "format": FORMAT,
      "platforms": list(platforms),
      "shapes": entries,
      "num_params": len(leaves),
      "param_dtypes": [x.dtype.name for x in arrays],  # How the runner reads each leaf back.
      "max_len": translator.max_len,
      "pad_id": PAD_ID,
      "eos_id": EOS_ID,
      "search": {"beam_size": search.beam_size, "alpha": search.alpha,
                 "max_extra": search.max_extra},
      "decode_devices": len(translator.devices),
      "batch_tokens": batch_tokens,
      "jax_version": jax.__version__,
      **vocabulary,
      **(provenance or {}),
  }
  return write_manifest(out, manifest)
