"""model.safetensors read one tensor at a time (safetensors' numpy API, no torch): an
import holds the converted tree and the one tensor it is converting, never the whole
file a second time, so NLLB-3.3B's 13 GB of float32 import on a 24 GB machine.

`StreamedWeights` is the name -> array mapping the importers consume (`pop`, `in`,
iteration over the names not yet taken); each tensor is read when popped. bf16 and fp16
tensors are cast to float32 (the default) or kept as stored (`dtype='stored'`: every
tensor must share one dtype, which becomes the model's param_dtype).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flax_transformer.errors import DataError

DTYPES = ("float32", "stored")


class StreamedWeights(dict):
  """The tensors of a safetensors file by name, each read from the file when popped."""

  def __init__(self, path: Path, dtype: str = "float32"):
    from safetensors import SafetensorError, safe_open
    if dtype not in DTYPES:
      raise DataError(f"--dtype={dtype!r} is not one of {list(DTYPES)}")
    try:
      self._file = safe_open(str(path), framework="numpy")
      names = list(self._file.keys())
      stored = {name: self._file.get_slice(name).get_dtype() for name in names}
    except (SafetensorError, OSError, ValueError) as e:
      raise DataError(f"{path}: not a readable safetensors file ({e})") from None
    super().__init__((name, None) for name in names)
    self.path, self.dtype = path, dtype
    self.stored_dtypes = sorted(set(stored.values()))
    if dtype == "stored" and len(self.stored_dtypes) > 1:
      raise DataError(f"{path}: tensors of several dtypes {self.stored_dtypes}: --dtype=stored "
                      "needs one (the default, float32, casts each)")

  def _read(self, name: str) -> np.ndarray:
    tensor = self._file.get_tensor(name)
    return tensor if self.dtype == "stored" else np.asarray(tensor, np.float32)

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
  """model.safetensors of `folder`, streamed (see convert.read_weights for a folder
  without one)."""
  from flax_transformer.pretrained import convert
  path = folder / "model.safetensors"
  if not path.is_file():
    convert.read_weights(folder)  # Its one line: the pickle's conversion command, or absent.
  return StreamedWeights(path, dtype)
