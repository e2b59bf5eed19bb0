"""export.py's work: a workdir's averaged model as StableHLO, a CTranslate2 directory or a
transformers MarianMTModel folder (an imported M2M100 / NLLB workdir: an
M2M100ForConditionalGeneration one)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path

from flax_transformer import provenance, storage
from flax_transformer import workdir as workdir_lib
from flax_transformer.errors import ConfigError, ExportWriteError
from flax_transformer.export import MANIFEST, folder_files
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

FORMATS = ("stablehlo", "ctranslate2", "transformers")


def run_export(*, workdir: str, out: str, fmt: str, search: SearchConfig, batch_tokens: int,
               average_last: int | None, checkpoint_step: int | None, platforms: list[str],
               quantization: str, overwrite: bool) -> None:
  """Loads `workdir`'s model, writes it in a fresh folder beside `out` and only then puts
  that folder in `out`'s place: a failure leaves a previous export whole."""
  if fmt not in FORMATS:
    raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
  if fmt == "transformers" and quantization != "float32":
    raise ConfigError(f"--quantization={quantization} is CTranslate2's: --format=transformers "
                      "writes float32 weights")
  target = check_out(out, workdir, overwrite)
  check_target_choice(fmt, workdir)
  if fmt == "ctranslate2":  # Before the model is read (NLLB-3.3B: 13 GB).
    from flax_transformer.export import ct2

    ct2.require_ctranslate2()
  translator = Translator.from_workdir(workdir, search=search, average_last=average_last,
                                       checkpoint_step=checkpoint_step,
                                       batch_tokens=batch_tokens)
  if translator.ensemble:
    raise ConfigError("export: one workdir at a time")
  record = {"workdir": str(workdir), "checkpoint_steps": list(translator.checkpoint_steps[0]),
            **provenance.commit()}
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(target, "partial")
    try:
      done = _write(fmt, translator, staging, target, search=search, batch_tokens=batch_tokens,
                    platforms=platforms, quantization=quantization, record=record)
      _swap_in(staging, target)
    finally:
      shutil.rmtree(staging, ignore_errors=True)  # Gone already when swapped in.
  except OSError as e:
    raise ExportWriteError(f"writing the export to {target} failed ({e.strerror or e}); is "
                           "the disk full or the folder unwritable? --out is as it was") from None
  logging.info("%s", done)


def _write(fmt: str, translator: Translator, folder: Path, target: Path, *,
           search: SearchConfig, batch_tokens: int, platforms: list[str], quantization: str,
           record: dict) -> str:
  """Writes the export into `folder` (to become `target`); returns the line to log."""
  if fmt == "stablehlo":
    from flax_transformer.export import stablehlo

    manifest = stablehlo.export_stablehlo(translator, folder, batch_tokens=batch_tokens,
                                          platforms=platforms, provenance=record)
    return (f"Wrote {len(manifest['shapes'])} beam search shapes for {','.join(platforms)} "
            f"to {target}; translate with: python {target / 'translate.py'} < in > out")
  config, params = translator.member(0)
  if fmt == "transformers":
    from flax_transformer.export import m2m100, marian

    imported_m2m100 = (getattr(translator.tokenizer, "spec", None) or {}).get(
        "kind") == "m2m100"
    module = m2m100 if imported_m2m100 else marian
    module.convert(config, params, translator.tokenizer, folder,
                   search={"beam_size": search.beam_size, "alpha": search.alpha},
                   provenance=record, languages=translator.languages)
    return (f"Wrote a transformers {module.ARCHITECTURE} folder (steps "
            f"{translator.checkpoint_steps[0]} averaged) to {target}; load it with "
            f"{module.LOADED_BY}")
  from flax_transformer.export import ct2

  ct2.convert(config, params, translator.tokenizer, folder, quantization=quantization,
              search={"beam_size": search.beam_size, "alpha": search.alpha,
                      "max_extra": search.max_extra}, provenance=record,
              languages=translator.languages)
  return (f"Wrote a CTranslate2 model ({quantization} weights, steps "
          f"{translator.checkpoint_steps[0]} averaged) to {target}")


def check_target_choice(fmt: str, workdir: str) -> None:
  """ConfigError, before the model loads, where the export could not be told its target:
  a model whose target is a token forced as the decoder's first output (trained here on
  several languages: `<2de>`; NLLB, M2M100) as StableHLO or a CTranslate2 directory
  with our translate.py, neither of which forces that token nor cuts it from the
  output. An imported M2M100 / NLLB model's CTranslate2 export does (`target_prefix`,
  the manifest's languages: docs/pretrained.md)."""
  languages = workdir_lib.languages(workdir)
  if languages.target_by != "decoder_prefix" or fmt == "transformers":
    return
  spec = (workdir_lib.read_record(workdir) or {}).get("tokenizer") or {}
  if fmt == "ctranslate2" and spec.get("kind") == "m2m100":
    return
  tokens = ", ".join(languages.target_tokens.get(c, c) for c in languages.targets)
  raise ConfigError(f"export --format={fmt} of {workdir}: its model chooses the target by a "
                    f"token forced as the decoder's first output ({tokens}), which the "
                    "exported translate.py can neither force nor cut from the output; "
                    "translate it with decode.py or serve.py (--target_lang)")


def check_out(out: str, workdir: str, overwrite: bool) -> Path:
  """--out as an absolute local path, or ConfigError before anything is loaded or
  touched: a bucket, a file, a non-empty folder without --overwrite, the workdir, a
  folder holding it, or one of its own entries (checkpoints, run.json, ...); with
  --overwrite, anything but an earlier export holding only the files its manifest lists."""
  if storage.is_remote(out):
    raise ConfigError(f"--out {out} is a bucket: export.py writes a local folder; write it "
                      "locally, then copy it to the bucket (gcloud storage cp -r, aws s3 cp "
                      "--recursive)")
  target = Path(out).resolve()  # '..' and symbolic links resolved, as for the workdir.
  if not storage.is_remote(workdir):
    run = Path(workdir).resolve()
    if target == run or target in run.parents:
      raise ConfigError(f"--out {out} is or holds the workdir {workdir}: choose a folder "
                        "outside it")
    if run in target.parents and target.relative_to(run).parts[0] in workdir_lib.ENTRIES:
      raise ConfigError(f"--out {out} is or is inside the workdir's own "
                        f"{run / target.relative_to(run).parts[0]}: choose a folder that is "
                        "not part of the run")
  if target.exists() and not target.is_dir():
    raise ConfigError(f"--out {out} is a file, not a folder")
  if target.exists() and any(target.iterdir()):
    if not overwrite:
      raise ConfigError(f"--out {out} exists and is not empty; choose another folder or pass "
                        "--overwrite")
    manifest = _export_manifest(target)
    if manifest is None:
      raise ConfigError(f"--out {out} is not an earlier export (no manifest.json of "
                        "export.py's formats in it): --overwrite replaces only an export; "
                        "choose an empty or new folder")
    listed = manifest.get("files")
    if not isinstance(listed, list):
      raise ConfigError(f"--out {out} is an export from before export.py listed its files "
                        "(its manifest.json has no \"files\"), so --overwrite cannot tell "
                        "them from files added since: move out what you keep, delete the "
                        "folder, then export again")
    listed = set(listed)
    added = [f for f in folder_files(target) if f not in listed]
    if added:
      shown = ", ".join(added[:3]) + (f" and {len(added) - 3} more" if len(added) > 3 else "")
      raise ConfigError(f"--out {out} holds files the export did not write ({shown}): "
                        "--overwrite would delete them; move them out or choose another "
                        "folder")
  return target


def _export_manifest(folder: Path) -> dict | None:
  """The manifest of the export `folder` holds (one of export.py's formats, nothing of a
  run), or None: --overwrite may replace an export, and nothing else."""
  from flax_transformer.export import m2m100, marian, runner

  # An export holds a vocab.model too; a run's other files it never holds.
  if any((folder / entry).exists() for entry in workdir_lib.ENTRIES
         if entry != workdir_lib.VOCAB_FILE):
    return None
  try:
    manifest = json.loads((folder / MANIFEST).read_text())
  except (OSError, ValueError):
    return None
  if isinstance(manifest, dict) and manifest.get("format") in (
      runner.FORMAT, runner.CT2_FORMAT, marian.FORMAT, m2m100.FORMAT):
    return manifest
  return None


def _sibling(target: Path, what: str) -> Path:
  """A new, empty folder beside `target` (the same file system: renames are atomic)."""
  folder = target.with_name(f".{target.name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
  folder.mkdir()
  return folder


def _swap_in(staging: Path, target: Path) -> None:
  """Renames the complete `staging` to `target`; a previous `target` goes only after."""
  if not target.exists():
    staging.rename(target)
    return
  previous = _sibling(target, "previous")
  target.rename(previous / target.name)
  try:
    staging.rename(target)
  except OSError:
    (previous / target.name).rename(target)
    raise
  finally:
    shutil.rmtree(previous, ignore_errors=True)
