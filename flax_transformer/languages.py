"""The languages a model translates from and into, and how a target is chosen: run.json's
"languages" record, one mechanism for every kind of model.

  {"sources": ["en", "de", "fr"],          codes the model translates from ([]: not stated)
   "targets": ["en", "de", "fr"],          codes it translates into
   "target_by": "none" | "decoder_prefix" | "source_tag",
   "target_tokens": {"de": "<2de>", ...},  code -> vocabulary piece
   "source_tokens": {"en": "__en__", ...}} code -> piece the tokenizer adds to the source

target_by "none": one target (a bilingual model); "decoder_prefix": target_tokens[code] is
forced as the decoder's first output (Johnson et al. 2017's target token at the decoder's
start; NLLB/M2M100's forced_bos_token_id; a multilingual model trained here);
"source_tag": target_tokens[code] is put before the source (OPUS-MT's >>xx<< models).
A workdir written before the record existed is read from its one pair (workdir.languages).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from flax_transformer.errors import ConfigError, DataError

TARGET_BY = ("none", "decoder_prefix", "source_tag")
# OPUS-MT's target tags: >>fra<<, >>pt_BR<<, >>zho_Hans<< (Tatoeba-Challenge's codes).
_MARIAN_TAG = re.compile(r"^>>([a-z]{2,3}(?:_[A-Za-z]{2,4})?)<<$")
_CODE = re.compile(r"^[a-z]{2,3}(?:[_-][A-Za-z]{2,4})?$")


class UnknownLanguageError(ConfigError):
  """A language or pair the model does not translate; the message names those it does."""


def target_piece(code: str) -> str:
  """The vocabulary piece of a model trained here that asks for target `code` (Johnson
  et al. 2017 write <2es>): forced as the decoder's first output."""
  return f"<2{code}>"


@dataclasses.dataclass(frozen=True)
class Languages:
  """run.json's "languages": what a model translates between (module docstring)."""

  sources: tuple[str, ...] = ()
  targets: tuple[str, ...] = ()
  target_by: str = "none"
  target_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
  source_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)

  @classmethod
  def one_pair(cls, source: str, target: str) -> Languages:
    return cls(sources=(source,), targets=(target,))

  @classmethod
  def trained(cls, codes: Iterable[str]) -> Languages:
    """A model trained here on every direction between `codes`: a target token each."""
    codes = tuple(codes)
    return cls(sources=codes, targets=codes, target_by="decoder_prefix",
               target_tokens={code: target_piece(code) for code in codes})

  @classmethod
  def from_json(cls, value: Any, where: str = "run.json") -> Languages:
    """The record as run.json holds it; a malformed one is a DataError naming the key."""
    if not isinstance(value, Mapping):
      raise DataError(f"{where}: languages={value!r} is not an object")
    unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise DataError(f"{where}: languages has unknown keys {sorted(unknown)}")
    lists = {}
    for key in ("sources", "targets"):
      codes = value.get(key, [])
      if not isinstance(codes, list) or not all(isinstance(c, str) and c for c in codes):
        raise DataError(f"{where}: languages.{key}={codes!r} is not a list of codes")
      lists[key] = tuple(codes)
    maps = {}
    for key in ("target_tokens", "source_tokens"):
      tokens = value.get(key, {})
      if not isinstance(tokens, Mapping) or not all(
          isinstance(k, str) and isinstance(v, str) and v for k, v in tokens.items()):
        raise DataError(f"{where}: languages.{key}={tokens!r} is not an object of code: piece")
      maps[key] = dict(tokens)
    languages = cls(**lists, target_by=value.get("target_by", "none"), **maps)
    problem = languages.problem()
    if problem:
      raise DataError(f"{where}: languages: {problem}")
    return languages

  def to_json(self) -> dict:
    return {"sources": list(self.sources), "targets": list(self.targets),
            "target_by": self.target_by, "target_tokens": dict(self.target_tokens),
            "source_tokens": dict(self.source_tokens)}

  def problem(self) -> str | None:
    """What makes the record unusable, or None."""
    if self.target_by not in TARGET_BY:
      return f"target_by={self.target_by!r} is not one of {list(TARGET_BY)}"
    if self.target_by == "none" and len(self.targets) > 1:
      return (f"target_by='none' with {len(self.targets)} targets {list(self.targets)}: "
              "a target must be chosen by decoder_prefix or source_tag")
    missing = [t for t in self.targets if self.target_by != "none"
               and t not in self.target_tokens]
    if missing:
      return f"targets {missing} have no target_tokens entry"
    return None

  @property
  def stated(self) -> bool:
    """Whether the model states its targets (an OPUS-MT import without tags does not)."""
    return bool(self.targets)

  @property
  def multiple(self) -> bool:
    """Whether a call must name its languages (more than one source or target)."""
    return len(self.sources) > 1 or len(self.targets) > 1

  def pairs(self) -> list[tuple[str, str]]:
    """Every (source, target) the model translates (a language into itself excluded when
    there are others)."""
    return [(s, t) for s in self.sources for t in self.targets
            if s != t or len(self.targets) == 1]

  def targets_of(self, source: str) -> list[str]:
    return [t for s, t in self.pairs() if s == source]

  @property
  def every_pair(self) -> bool:
    """Whether each of more than three languages translates into each other one (NLLB's
    202): its pairs are then said as one list of languages, not as 202 x 201 pairs."""
    return len(self.targets) > 3 and set(self.sources) == set(self.targets)

  def _known(self) -> str:
    if not self.sources:
      return f"it translates into {', '.join(self.targets)} (from a source it does not state)"
    if self.every_pair:
      return (f"it translates between any two of its {len(self.targets)} languages: "
              f"{', '.join(self.targets)}")
    return ("it knows " + "; ".join(f"{s} -> {', '.join(self.targets_of(s))}"
                                   for s in self.sources))

  def check_pair(self, source: str | None, target: str | None) -> tuple[str | None, str | None]:
    """(source, target) as the model reads them: a code left None is the model's only one
    (None where it states none, or for a source_tag model whose texts carry their own
    tags); a pair it does not translate is an UnknownLanguageError naming the pairs it
    does. A code may be the model's or its ISO 639 form ('fr' for 'fra_Latn' or 'fra':
    language_codes.py)."""
    if not self.stated:
      return source, target
    source, target = self.model_code(source, self.sources), self.model_code(target, self.targets)
    if target is None and len(self.targets) > 1 and self.target_by == "source_tag":
      return source, None  # The text names its target itself (OPUS-MT's '>>fra<< ...').
    if target is None:
      if len(self.targets) > 1:
        raise UnknownLanguageError(f"name a target language: {self._known()}")
      target = self.targets[0]
    if source is None and len(self.sources) == 1:
      source = self.sources[0]
    if target not in self.targets:
      raise UnknownLanguageError(f"the model does not translate into {target!r}: "
                                 f"{self._known()}")
    if self.sources and source is not None and (source, target) not in self.pairs():
      what = (f"from {source!r}" if source not in self.sources
              else f"from {source!r} into {target!r}")
      raise UnknownLanguageError(f"the model does not translate {what}: {self._known()}")
    if self.sources and source is None and len(self.sources) > 1 and self.source_tokens:
      raise UnknownLanguageError(f"name a source language: {self._known()}")
    return source, target

  def model_code(self, code: str | None, among: Iterable[str] | None = None) -> str | None:
    """`code` as the model writes it: itself if the model knows it, else the model's code
    (`among`: of those; default every one) whose ISO 639 form it is
    (language_codes.resolve), else as given."""
    known = list(dict.fromkeys([*self.sources, *self.targets] if among is None else among))
    if code is None or code in known:
      return code
    from flax_transformer import language_codes  # langcodes: imported only for this.
    return language_codes.resolve(code, known) or code

  def target_token(self, target: str) -> str | None:
    """The piece that asks for `target` (None for a one-target model)."""
    return None if self.target_by == "none" else self.target_tokens[target]


def from_config(config: Mapping) -> Languages | None:
  """The languages of a run trained here from its config (as run.json's launch holds it):
  `languages` (codes, every direction between them: a multilingual run) or the
  source_lang/target_lang pair; None when it names neither."""
  codes = config.get("languages")
  if codes:
    return Languages.trained(parse_codes(codes, "--config.languages"))
  if config.get("source_lang") and config.get("target_lang"):
    return Languages.one_pair(config["source_lang"], config["target_lang"])
  return None


def parse_codes(value: str | Iterable[str], where: str) -> tuple[str, ...]:
  """Codes from 'en,de,fr' or a list: two or more, distinct; else a ConfigError."""
  codes = tuple(c.strip() for c in (value.split(",") if isinstance(value, str) else value))
  if len(codes) < 2 or len(set(codes)) != len(codes) or not all(_CODE.match(c) for c in codes):
    raise ConfigError(f"{where}={value!r}: give two or more distinct language codes, as en,de,fr")
  return codes


def from_marian(pieces: Iterable[str], tokenizer_config: Mapping) -> Languages:
  """An OPUS-MT model's: its >>xx<< tags as source_tag targets when the vocabulary has
  them, else its tokenizer_config's one pair (when both look like language codes; a
  folder naming a group, as en-ROMANCE, states none)."""
  source = tokenizer_config.get("source_lang")
  source = source if isinstance(source, str) and _CODE.match(source) else None
  tags = {m.group(1): piece for piece in pieces if (m := _MARIAN_TAG.match(piece))}
  if tags:
    return Languages(sources=(source,) if source else (), targets=tuple(sorted(tags)),
                     target_by="source_tag", target_tokens=dict(sorted(tags.items())))
  target = tokenizer_config.get("target_lang")
  if source and isinstance(target, str) and _CODE.match(target):
    return Languages.one_pair(source, target)
  return Languages()


def from_record(record: Mapping, pieces: Iterable[str] | None = None) -> Languages:
  """A run record's languages: its "languages" entry, else (a workdir written before it)
  the last launch's data config, an FSMT tokenizer's langs, an OPUS-MT vocabulary's tags
  (`pieces`, when given); Languages() (none stated) when nothing says."""
  if "languages" in record:
    return Languages.from_json(record["languages"])
  config = ((record.get("launches") or [{}])[-1] or {}).get("config") or {}
  languages = from_config(config)
  if languages is not None:
    return languages
  langs = (record.get("tokenizer") or {}).get("langs")
  if isinstance(langs, list) and len(langs) == 2:
    return Languages.one_pair(langs[0], langs[1])
  if pieces is not None:
    return from_marian(pieces, {})
  return Languages()
