"""model.safetensors read one tensor at a time (safetensors' numpy API, no torch): an
import holds the converted tree and the one tensor it is converting, never the whole
file a second time, so NLLB-3.3B's 13 GB of float32 import on a 24 GB machine.

`StreamedWeights` is the name -> array mapping the importers consume (`pop`, `in`,
iteration over the names not yet taken); each tensor is read when popped. bf16 and fp16
tensors are cast to float32 (the default) or kept as stored (`dtype='stored'`: every
tensor must share one dtype, which becomes the model's param_dtype). A sharded save
(model.safetensors.index.json naming model-0000i-of-0000n.safetensors: transformers 4.x
shards at 5 GB, so NLLB-1.3B and 3.3B come so) streams the same way, shard by shard.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flax_transformer.errors import DataError

DTYPES = ("float32", "stored")


# safetensors' dtype names -> numpy's (bf16: ml_dtypes', which jax brings).
NUMPY_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool"}


def read_header(path: Path) -> tuple[dict, int]:
  """(name -> {dtype, shape, data_offsets}, where the data starts) of a safetensors file:
  an 8-byte little-endian header length, then the JSON header (the format's whole
  specification); a malformed one is a DataError."""
  try:
    with open(path, "rb") as f:
      length = int.from_bytes(f.read(8), "little")
      if not 2 <= length <= 100_000_000:
        raise ValueError(f"header length {length}")
      header = json.loads(f.read(length))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, entry in tensors.items():
      begin, finish = entry["data_offsets"]
      if entry["dtype"] not in NUMPY_DTYPES or not 0 <= begin <= finish:
        raise ValueError(f"tensor {name!r}: {entry}")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{path}: not a readable safetensors file ({e})") from None
  return tensors, 8 + length


class StreamedWeights(dict):
  """The tensors of a safetensors file by name, each read from the file when popped.

  Read with pread, not through safetensors' mmap: the pages of a mapped file stay resident
  (and counted in the process' RSS) after their tensor is converted, so a mapped 13 GB
  file would add 13 GB to the import's peak (bench/import_memory.py measured it)."""

  def __init__(self, path: Path, dtype: str = "float32", weight_map: dict | None = None):
    """path: model.safetensors, or a sharded save's index (its `weight_map`: tensor -> the
    file beside it that holds it)."""
    import ml_dtypes  # noqa: F401 (numpy's 'bfloat16')
    if dtype not in DTYPES:
      raise DataError(f"--dtype={dtype!r} is not one of {list(DTYPES)}")
    self._entries, self._file = {}, {}  # name -> header entry; -> (file, data start).
    shards = [path.parent / name for name in dict.fromkeys((weight_map or {}).values())]
    for file in shards or (path,):
      entries, start = read_header(file)
      for name in set(entries) & set(self._entries):
        raise DataError(f"{file}: tensor {name!r} is in {self._file[name][0].name} too")
      self._entries.update(entries)
      self._file.update((name, (file, start)) for name in entries)
    if weight_map is not None:
      _check_map(path, weight_map, {name: file.name for name, (file, _) in self._file.items()})
    super().__init__((name, None) for name in self._entries)
    self.path, self.dtype = path, dtype
    self.stored_dtypes = sorted({e["dtype"] for e in self._entries.values()})
    if dtype == "stored" and len(self.stored_dtypes) > 1:
      raise DataError(f"{path}: tensors of several dtypes {self.stored_dtypes}: --dtype=stored "
                      "needs one (the default, float32, casts each)")

  def _read(self, name: str) -> np.ndarray:
    entry = self._entries[name]
    begin, finish = entry["data_offsets"]
    dtype = np.dtype(NUMPY_DTYPES[entry["dtype"]])
    count = int(np.prod(entry["shape"], dtype=np.int64))
    path, start = self._file[name]
    if finish - begin != dtype.itemsize * count:
      raise DataError(f"{path}: tensor {name!r} does not fit its shape {entry['shape']} "
                      f"and dtype {entry['dtype']}")
    with open(path, "rb") as f:
      f.seek(start + begin)
      tensor = np.fromfile(f, dtype, count)  # One allocation, written in place.
    if tensor.size != count:
      raise DataError(f"{path}: tensor {name!r} is cut short (a truncated file?)")
    tensor = tensor.reshape(entry["shape"])
    return tensor if self.dtype == "stored" else tensor.astype(np.float32, copy=False)

  def pop(self, name, *default):
    if name not in self:
      if default:
        return default[0]
      raise KeyError(name)
    super().pop(name)
    return self._read(name)

  def __getitem__(self, name):
    if name not in self:
      raise KeyError(name)
    return self._read(name)

  @property
  def param_dtype(self) -> str:
    """The model's param_dtype: float32, or the stored one (`dtype='stored'`)."""
    if self.dtype != "stored" or not self.stored_dtypes:
      return "float32"
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32",
            "F64": "float64"}.get(self.stored_dtypes[0], "float32")


def read(folder: Path, dtype: str = "float32") -> StreamedWeights:
  """model.safetensors of `folder`, or the shards its model.safetensors.index.json names,
  streamed (see convert.read_weights for a folder with neither)."""
  from flax_transformer.pretrained import convert
  path, index = folder / "model.safetensors", folder / INDEX
  if path.is_file():
    return StreamedWeights(path, dtype)
  if index.is_file():
    return StreamedWeights(index, dtype, _weight_map(index))
  if (folder / "pytorch_model.bin.index.json").is_file():
    raise DataError(f"{folder} has sharded pytorch_model-*.bin files but no safetensors; "
                    "this import reads safetensors only (no torch). Convert them once: "
                    + convert.CONVERT_BIN.format(folder=folder))
  convert.read_weights(folder)  # Its one line: the pickle's conversion command, or absent.
  raise DataError(f"{path} not found")


INDEX = "model.safetensors.index.json"


def _check_map(index: Path, weight_map: dict[str, str], held: dict[str, str]) -> None:
  """Each tensor in the file the index names for it, and no other tensor in the files."""
  for name in sorted(set(weight_map) | set(held)):
    if weight_map.get(name) != held.get(name):
      raise DataError(f"{index}: tensor {name!r} is in {held.get(name, 'none of the files')}, "
                      f"the index names {weight_map.get(name, 'no file')}")


def _weight_map(index: Path) -> dict[str, str]:
  """A sharded save's tensor -> file map, each file present (StreamedWeights checks that
  the files hold the tensors it names)."""
  try:
    weight_map = json.loads(index.read_text())["weight_map"]
    if not isinstance(weight_map, dict) or not weight_map or not all(
        isinstance(v, str) and v and "/" not in v for v in weight_map.values()):
      raise ValueError("weight_map is not an object of tensor: file name")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{index}: not a safetensors index ({e})") from None
  for name in dict.fromkeys(weight_map.values()):
    if not (index.parent / name).is_file():
      raise DataError(f"{index.parent / name} not found (named by {index.name})")
  return weight_map
