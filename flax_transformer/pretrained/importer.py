"""import_model.py's work: the architecture a folder's config.json names, its module's
conversion, the workdir written (`convert.write_workdir`)."""

from __future__ import annotations

import importlib
from pathlib import Path

from flax_transformer import new_workdir
from flax_transformer.errors import DataError
from flax_transformer.pretrained import convert
from flax_transformer.workdir import Workdir

# model_type (config.json) -> the module whose `import_folder(folder) -> convert.Imported`
# converts it.
ARCHITECTURES = {"marian": "flax_transformer.pretrained.marian",
                 "fsmt": "flax_transformer.pretrained.fsmt",
                 "m2m_100": "flax_transformer.pretrained.m2m100"}
# The architectures whose import streams tensors and keeps bf16/fp16 as stored on request.
STREAMED = ("m2m_100",)


def import_folder(folder: str | Path, dtype: str = "float32") -> convert.Imported:
  """The converted model of a transformers folder (not written anywhere). dtype:
  'float32' casts stored bf16/fp16 tensors, 'stored' keeps them (m2m_100's import)."""
  folder = Path(folder)
  model_type = convert.read_config_json(folder).get("model_type")
  if model_type not in ARCHITECTURES:
    raise DataError(f"{folder / 'config.json'}: model_type {model_type!r} is not one this "
                    f"importer converts ({', '.join(sorted(ARCHITECTURES))})")
  module = importlib.import_module(ARCHITECTURES[model_type])
  if dtype == "float32":
    return module.import_folder(folder)
  if model_type not in STREAMED:
    raise DataError(f"--dtype={dtype}: model_type {model_type!r} imports as float32 only "
                    f"(--dtype is {', '.join(STREAMED)}'s)")
  return module.import_folder(folder, dtype)


def import_model(folder: str | Path, workdir: str | Path, dtype: str = "float32") -> None:
  """Converts the model in `folder` and writes it as the new workdir `workdir`."""
  new_workdir.check_new(Workdir(workdir))  # At once: not after converting a large model.
  convert.write_workdir(import_folder(folder, dtype), workdir, Path(folder))
