"""A trained model for use without this package: StableHLO through jax.export, and CTranslate2.

`stablehlo.export_stablehlo` writes the averaged model's encoder and beam search
as serialized StableHLO, one module per batch shape, with its parameters, the
vocabulary, a manifest and `runner.py` (jax, numpy and sentencepiece only) as
`translate.py`. `ct2.convert` writes a CTranslate2 model directory. export.py
is the command for both.
"""

import json
import os
from pathlib import Path

MANIFEST = "manifest.json"


def folder_files(folder: str | Path) -> list[str]:
  """Every file under `folder` as sorted POSIX paths relative to it; symbolic links
  count as files and are not followed."""
  root = Path(folder)
  found = []
  for parent, dirs, files in os.walk(root):
    here = Path(parent)
    found += [(here / name).relative_to(root).as_posix()
              for name in files + [d for d in dirs if (here / d).is_symlink()]]
  return sorted(found)


def write_manifest(folder: str | Path, manifest: dict) -> dict:
  """Writes `manifest` as `folder`/manifest.json, the export's last file, listing under
  "files" every file the folder then holds, itself included (export.py writes into a
  fresh folder: what the export wrote). export.py --overwrite replaces only those."""
  manifest = {**manifest, "files": sorted({*folder_files(folder), MANIFEST})}
  (Path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
  return manifest


def write_vocabulary(folder: str | Path, tokenizer, languages=None) -> dict:
  """What the runner tokenizes with, into `folder`: a trained model's vocab.model, or an
  imported Marian model's files (pretrained.tokenizers; their kind goes into the
  manifest: the manifest entries are returned), with `languages` (the workdir's record)
  where its target is a tag before the source (OPUS-MT's '>>fra<<': the runner's
  --target_lang puts it). Other imported tokenizers are refused."""
  folder = Path(folder)
  spec = getattr(tokenizer, "spec", None)
  if spec is None:
    (folder / "vocab.model").write_bytes(tokenizer.model_bytes())
    return {}
  if spec.get("kind") != "marian":
    from flax_transformer.errors import ConfigError
    raise ConfigError(f"export: the exported runner reads sentencepiece vocabularies; this "
                      f"imported model's tokenizer ({spec.get('kind')}) is not one: translate "
                      "it with decode.py or serve.py")
  for name in spec["files"]:
    (folder / name).write_bytes((tokenizer.path / name).read_bytes())
  tagged = languages is not None and languages.target_by == "source_tag"
  return {"tokenizer": spec, **({"languages": languages.to_json()} if tagged else {})}

