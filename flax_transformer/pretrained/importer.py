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


def import_folder(folder: str | Path) -> convert.Imported:
  """The converted model of a transformers folder (not written anywhere)."""
  folder = Path(folder)
  model_type = convert.read_config_json(folder).get("model_type")
  if model_type not in ARCHITECTURES:
    raise DataError(f"{folder / 'config.json'}: model_type {model_type!r} is not one this "
                    f"importer converts ({', '.join(sorted(ARCHITECTURES))})")
  return importlib.import_module(ARCHITECTURES[model_type]).import_folder(folder)


def import_model(folder: str | Path, workdir: str | Path) -> None:
  """Converts the model in `folder` and writes it as the new workdir `workdir`."""
  new_workdir.check_new(Workdir(workdir))  # At once: not after converting a large model.
  convert.write_workdir(import_folder(folder), workdir, Path(folder))
