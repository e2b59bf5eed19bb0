"""export.py's work: a workdir's averaged model as StableHLO or a CTranslate2 directory."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from flax_transformer import provenance
from flax_transformer.errors import ConfigError
from flax_transformer.translation.translator import SearchConfig, Translator

FORMATS = ("stablehlo", "ctranslate2")


def run_export(*, workdir: str, out: str, fmt: str, search: SearchConfig, batch_tokens: int,
               average_last: int, checkpoint_step: int | None, platforms: list[str],
               quantization: str, overwrite: bool) -> None:
  if fmt not in FORMATS:
    raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
  target = Path(out)
  if target.exists() and any(target.iterdir()):
    if not overwrite:
      raise ConfigError(f"--out {target} exists and is not empty; choose another folder or "
                        "pass --overwrite")
    shutil.rmtree(target)
  translator = Translator.from_workdir(workdir, search=search, average_last=average_last,
                                       checkpoint_step=checkpoint_step,
                                       batch_tokens=batch_tokens)
  if translator.ensemble:
    raise ConfigError("export: one workdir at a time")
  record = {"workdir": str(workdir), "checkpoint_steps": list(translator.checkpoint_steps[0]),
            **provenance.commit()}
  if fmt == "stablehlo":
    from flax_transformer.export import stablehlo

    manifest = stablehlo.export_stablehlo(
        translator, target, batch_tokens=batch_tokens, platforms=platforms, provenance=record)
    logging.info("Wrote %d beam search shapes for %s to %s; translate with: python %s < in > out",
                 len(manifest["shapes"]), ",".join(platforms), target, target / "translate.py")
  else:
    from flax_transformer.export import ct2

    config, params = translator.member(0)
    ct2.convert(config, params, translator.tokenizer, target, quantization=quantization,
                search={"beam_size": search.beam_size, "alpha": search.alpha,
                        "max_extra": search.max_extra}, provenance=record)
    logging.info("Wrote a CTranslate2 model (%s weights, steps %s averaged) to %s", quantization,
                 translator.checkpoint_steps[0], target)
