"""The sentences waiting for the batcher's search thread (batcher.py), and how many of
them its next search takes.

Each waiting sentence is an Item of its request (a translate Job), grouped by the
program that searches it: (option set, prefixed, row width). The search thread takes
the group holding the oldest sentence (so none waits behind newer ones for long), its
oldest sentences first, as many as `search_rows` says: a search costs its rows,
filler or not (a tiny model's search runs the same steps for every row), so while
other work waits a search takes a full rung of the row ladder and leaves the rest
to the next search of its group, which the requests arriving meanwhile fill up
(decode.py fills its batches from a whole file sorted by length; a server fills
them from what is waiting).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Callable, Iterable

from flax_transformer.serving.batch_jobs import Job, answer, family_key
from flax_transformer.translation.search_config import SearchConfig

GroupKey = tuple[SearchConfig, bool, int]  # (family_key(search), prefixed, width)


def row_ladder(devices: int, max_batch: int) -> list[int]:
  """Batch rows the server compiles: devices, doubling, up to max_batch (rounded up to a
  multiple of `devices`, as every batch is split over the devices). Doubling, so a
  search of what is waiting pads less than a half of its rows, and a full rung is
  always within a factor of two of it."""
  top = -(-max_batch // devices) * devices
  ladder, rows = [], devices
  while rows < top:
    ladder.append(rows)
    rows *= 2
  return ladder + [top]


def search_rows(waiting: int, ladder: list[int], ready: set[int], more_work: bool) -> int:
  """Rows of the next search of a group with `waiting` sentences: the ladder's top if
  they fill it; else, while `more_work` waits (other groups, new requests), the largest
  `ready` rung they fill (no filler rows; the rest wait for company); else the smallest
  ready rung that holds them all; else the smallest rung that does (compiled first).
  `ready`: the rungs whose program has run (their use compiles nothing)."""
  top = ladder[-1]
  if waiting >= top:
    return top
  filled = [rows for rows in ladder if rows <= waiting and rows in ready]
  if filled and (more_work or filled[-1] == waiting):
    return filled[-1]
  holding = [rows for rows in ladder if rows >= waiting]
  return next((rows for rows in holding if rows in ready), holding[0])


def needed_rows(waiting: int, ladder: list[int], ready: set[int]) -> set[int]:
  """The rungs that search `waiting` sentences of a group, none left: the top for each
  full one, and `search_rows`' for the rest."""
  top = ladder[-1]
  needed = {top} if waiting >= top else set()
  if waiting % top:
    needed.add(search_rows(waiting % top, ladder, ready, False))
  return needed


def deliver(items: list[Item], found: list) -> None:
  """Each item's n-best list (`found`, in order; cut to its request's nbest) into its
  request's answer, which is sent once its last sentence has one."""
  for item, hyps in zip(items, found):
    job = item.job
    job.results[item.index] = hyps[:job.search.nbest]
    job.left -= 1
    if not job.left:
      answer(job.future, job.results)


@dataclasses.dataclass(eq=False)
class Item:
  """Sentence `index` of `job`, waiting since `order` (smaller: earlier), in group `group`
  (its option set's family, prefixed, its width)."""
  job: Job
  index: int
  group: GroupKey
  order: int

  @property
  def sentence(self) -> str:
    return self.job.sentences[self.index]

  @property
  def prefix(self) -> str | None:
    return None if self.job.prefixes is None else self.job.prefixes[self.index]



class Pending:
  """Waiting sentences by group, each group oldest first."""

  def __init__(self):
    self._groups: dict[GroupKey, collections.deque[Item]] = {}
    self._order = itertools.count()
    self.count = 0  # Sentences waiting, over every group.

  def add_job(self, job: Job, width_of: Callable[[str, str | None], int]) -> None:
    """`job`'s sentences (a translate job), each searched at width_of(sentence, prefix);
    its answer is due once every one has been searched (`job.results`, `job.left`)."""
    job.results, job.left = [None] * len(job.sentences), len(job.sentences)
    order, search, given = next(self._order), family_key(job.search), job.prefixes is not None
    prefixes = job.prefixes or [None] * len(job.sentences)
    self.add([Item(job, i, (search, given, width_of(sentence, prefix)), order)
              for i, (sentence, prefix) in enumerate(zip(job.sentences, prefixes))])

  def add(self, items: Iterable[Item]) -> None:
    """Items, new or back from a compile (they keep their place: their `order`)."""
    unsorted = set()
    for item in items:
      key = item.group
      group = self._groups.setdefault(key, collections.deque())
      if group and item.order < group[-1].order:  # Back from a compile, behind newer ones.
        unsorted.add(key)
      group.append(item)
      self.count += 1
    for key in unsorted:
      self._groups[key] = collections.deque(sorted(self._groups[key], key=lambda i: i.order))

  def oldest(self) -> tuple[GroupKey, int] | None:
    """The group holding the oldest waiting sentence, and how many it holds."""
    if not self._groups:
      return None
    key = min(self._groups, key=lambda k: self._groups[k][0].order)
    return key, len(self._groups[key])

  def take(self, key: GroupKey, count: int) -> list[Item]:
    """The `count` oldest sentences of group `key` (all if fewer)."""
    group = self._groups[key]
    items = [group.popleft() for _ in range(min(count, len(group)))]
    if not group:
      del self._groups[key]
    self.count -= len(items)
    return items

  def drop_done(self) -> list[Job]:
    """Drops the sentences of requests already answered or cancelled (their clients hung
    up: none will read them); returns the jobs dropped, each once (over every call)."""
    dropped: dict[int, Job] = {}
    for key in list(self._groups):
      group = self._groups[key]
      kept = collections.deque(item for item in group if not item.job.future.done())
      for item in group:
        if item.job.future.done() and not item.job.dropped:
          item.job.dropped = True
          dropped[id(item.job)] = item.job
      self.count -= len(group) - len(kept)
      if kept:
        self._groups[key] = kept
      else:
        del self._groups[key]
    return list(dropped.values())
