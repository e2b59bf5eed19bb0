"""What the batcher (batcher.py) queues and keeps: a request's job, an option set's
family of compiled searches, and the helpers that answer and key them."""

from __future__ import annotations

import concurrent.futures
import dataclasses

from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator


def answer(future: concurrent.futures.Future, result=None, error: BaseException | None = None
            ) -> None:
  """Sets `future`'s result (or `error`) unless it is done: its caller may have cancelled
  it (uvicorn's shutdown, any Python caller), and its batch-mates are answered all the
  same. set_running_or_notify_cancel makes a cancel and the answer exclusive: a cancel
  between it and set_result fails."""
  if future.done() or not future.set_running_or_notify_cancel():
    return
  if error is None:
    future.set_result(result)
  else:
    future.set_exception(error)


def direction(job: Job, i: int) -> tuple[str | None, str | None]:
  return job.directions[i] if job.directions is not None else (None, None)


def languages_of(directions) -> dict:
  """Translator's source_lang and target_lang, a code per row."""
  return {"source_lang": [s for s, _ in directions], "target_lang": [t for _, t in directions]}


def family_key(search: SearchConfig) -> SearchConfig:
  """The option set whose programs serve `search`: its nbest is the beam's."""
  return dataclasses.replace(search, nbest=search.beam_size)


@dataclasses.dataclass
class Job:
  kind: str  # "translate" or "score"
  sentences: list[str]  # The sources.
  search: SearchConfig | None
  future: concurrent.futures.Future
  prefixes: list[str] | None = None  # Translate: per sentence, its forced prefix.
  targets: list[str] | None = None  # Score: per sentence, its target.
  # Per sentence, its (source, target) languages (None: the model's only one).
  directions: list[tuple[str | None, str | None]] | None = None
  # Translate, while its sentences wait (pending.py): per sentence, its n-best list once
  # searched; how many are not yet; whether its rest was dropped (answered or cancelled).
  results: list | None = None
  left: int = 0
  dropped: bool = False


@dataclasses.dataclass
class Family:
  """The searches of one option set: a Translator per [rows, width], the programs
  (rows, width, prefixed) that have run once (ready: their use compiles nothing), and
  those compiling on the compile thread."""
  translators: dict[tuple[int, int | None], Translator] = dataclasses.field(default_factory=dict)
  ready: set[tuple[int, int, bool]] = dataclasses.field(default_factory=set)
  compiling: dict[tuple[int, int, bool], concurrent.futures.Future] = dataclasses.field(
      default_factory=dict)
  # Per program compiling: the requests waiting for it (none left wanting it: skipped).
  waiters: dict[tuple[int, int, bool], list] = dataclasses.field(default_factory=dict)
