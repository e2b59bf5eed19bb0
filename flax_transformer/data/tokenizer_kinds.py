"""The tokenizer kinds a workdir may name: kind -> the loader of its files.

A trained workdir has one sentencepiece vocabulary (`data.tokenizer.Tokenizer`); an
imported one keeps its model's tokenizer files and names their kind in run.json's
"tokenizer" entry ({"kind": "marian", ...}). The code of those kinds
(`pretrained.tokenizers`) sits above the workdir and registers its loader here when
imported; `workdir.read_run` reads through `load`, so the workdir never imports the
importers. Whatever reads a workdir's tokenizer (translation, averaging, init_from)
imports `pretrained.tokenizers` first.
"""

from __future__ import annotations

from typing import Any, Callable

from flax_transformer.errors import DataError

Loader = Callable[[Any, dict], Any]  # (directory, run.json's "tokenizer" entry) -> tokenizer.
LOADERS: dict[str, Loader] = {}


def register(kind: str, loader: Loader) -> None:
  """`loader` reads the tokenizers of `kind` from now on."""
  LOADERS[kind] = loader


def load(directory, spec: dict):
  """The tokenizer run.json's "tokenizer" entry `spec` names, from `directory`."""
  kind = spec.get("kind") if isinstance(spec, dict) else None
  if kind not in LOADERS:
    raise DataError(f"run.json: tokenizer kind {kind!r} is not one of {sorted(LOADERS)}")
  return LOADERS[kind](directory, spec)
