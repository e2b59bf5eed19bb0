"""Dynamic batching: concurrent requests' sentences searched together, in full batches.

One worker thread owns every search. Requests queue up while a search runs; the
worker takes all that are queued, and their sentences wait (pending.py) grouped by
search options and row width. Each search takes the group holding the oldest
sentence, in a warmed shape [rows, width] (rows from a doubling ladder): while other
work waits, as many as fill its rows (the rest go with the next, which the requests
arriving meanwhile fill up), else all, with filler rows. With nothing waiting, a
request waits up to `max_wait_s` for company (up to `max_batch` sentences). Each
request gets its own sentences' answers back, in order, once its last is searched.

A group whose program has not run yet (new search options, a first prefix at
some shape) is not searched on that thread: its shapes compile on a compile
thread while the search thread serves the others, and its requests go back to
the queue once their programs are ready. So a new option set delays its own
requests by its compile, and nobody else's.

At most `max_configs` option sets stay compiled: beyond, the least recently used
one is dropped, but never one with requests waiting (queued, compiling, requeued):
dropped, they would compile again, and more sets than slots would starve. Such
sets are kept over the cap until their requests are answered.

A request whose future is cancelled (its client hung up: app.py) is dropped before its
search, and a compile that only cancelled requests wait for is skipped: its set is idle.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Sequence

from flax_transformer.serving.batch_jobs import (Family, Job, answer, direction,
                                                  family_key, languages_of)
from flax_transformer.serving.pending import (Item, Pending, deliver, needed_rows,
                                              row_ladder, search_rows)
from flax_transformer.translation import search_memory
from flax_transformer.translation.batching import bucket_length
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator

WIDTH_MULTIPLE = 16  # programs.search_batches' bucket multiple: a width is one shape.


class Batcher:
  """Serves translate/score requests from many threads through one search thread.

  `base`: the model (its params are placed on its devices once and shared by every
  search variant). `max_tokens`: the longest source (tokens, EOS included) a
  request may hold; widths up to it are warmed. `max_configs`: search option
  sets kept compiled at once (each costs its programs' memory, not the params').
  """

  def __init__(self, base: Translator, *, max_batch: int = 64, max_wait_s: float = 0.005,
               max_tokens: int = 64, max_configs: int = 8):
    self.tokenizer = base.tokenizer
    self.default_search = base.search
    self.devices = list(base.devices)
    self.max_len = base.max_len  # The model's (the ensemble's shortest).
    self.max_tokens = min(max_tokens, base.max_len)
    self.max_batch, self.max_wait_s, self.max_configs = max_batch, max_wait_s, max_configs
    self.ladder = row_ladder(len(self.devices), max_batch)
    self.widths = list(range(WIDTH_MULTIPLE, bucket_length(self.max_tokens, WIDTH_MULTIPLE) + 1,
                             WIDTH_MULTIPLE))
    # The base's placed copy: every Translator below gets these arrays, and jax.device_put
    # of arrays already on that sharding returns them as they are (one copy per device).
    self._params = base._placed_params
    self._model = base
    # A model that forces its target's token runs the forced-prefix program for every
    # request; warming names one of its pairs (directions.py): a source too, which a
    # model whose tokenizer adds the source's token (NLLB, M2M100) needs.
    self._forces = base.languages.target_by == "decoder_prefix"
    self._added = base._directions.added_tokens(self.tokenizer.source.tokenize)
    pairs = base.languages.pairs() or [(None, (base.languages.targets or (None,))[0])]
    self._warm = dict(zip(("source_lang", "target_lang"), pairs[0] if self._forces
                          else (None, None)))
    self._families: collections.OrderedDict[SearchConfig, Family] = collections.OrderedDict()
    self._families_lock = threading.Lock()  # Used by warm()'s, the search and compile threads.
    # Per option set (family_key): requests submitted and not yet answered; the lock's.
    self._waiting: collections.Counter[SearchConfig] = collections.Counter()
    self._compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="compile")
    # Requests, and Items back from their compile; on the search thread, those waiting.
    self._queue: queue.Queue[Job | list[Item]] = queue.Queue()
    self._pending, self._scores = Pending(), []
    # cancelled: requests dropped unsearched, their futures cancelled (clients gone);
    # rows: the searches' rows, filler rows included (sentences / rows: how full they were).
    self.stats = {"requests": 0, "sentences": 0, "searches": 0, "rows": 0, "cancelled": 0}
    self._stats_lock = threading.Lock()
    self._thread = threading.Thread(target=self._loop, name="search", daemon=True)
    self._thread.start()

  # --- Public: from any thread -----------------------------------------------------------

  def source_length(self, sentence: str) -> int:
    """Tokens of `sentence` as the model reads it (EOS included), with the most any
    direction adds (an OPUS-MT target's >>xx<< tag): what --max_tokens bounds."""
    return len(self.tokenizer.source.tokenize(sentence)) + self._added

  def prefix_length(self, prefix: str) -> int:
    """Tokens of `prefix` as forced (no EOS, as `Translator.translate_nbest` forces it)."""
    return len(self.tokenizer.target.tokenize(prefix)) - 1

  def width(self, sentence: str, prefix: str | None = None) -> int:
    """The row width (tokens) `sentence` is searched at: its source's, or its forced
    prefix's if longer (programs.search_batches), in multiples of 16."""
    length = self.source_length(sentence)
    if prefix is not None:
      length = max(length, self.prefix_length(prefix))
    return bucket_length(min(length, self.max_tokens), WIDTH_MULTIPLE)

  def translate(self, sentences: Sequence[str], search: SearchConfig,
                prefixes: Sequence[str] | None = None, directions=None
                ) -> concurrent.futures.Future:
    """-> Future of, per sentence, `search.nbest` (translation, score) pairs, best first.
    directions: per sentence, its (source, target) languages (requests mix them)."""
    return self._submit(Job("translate", list(sentences), search, concurrent.futures.Future(),
                             prefixes=None if prefixes is None else list(prefixes),
                             directions=directions))

  def score(self, sources: Sequence[str], targets: Sequence[str], directions=None
            ) -> concurrent.futures.Future:
    """-> Future of, per pair, {"logprob": log P(target | source), "tokens": target tokens
    (EOS included)}, from `Translator.score` (directions: as `translate`'s)."""
    return self._submit(Job("score", list(sources), None, concurrent.futures.Future(),
                             targets=list(targets), directions=directions))

  def check_fits(self, search: SearchConfig) -> None:
    """A ConfigError (one line) if `search`'s largest batch (split over the devices)
    cannot fit in a device's memory; nothing for an option set already compiled."""
    with self._families_lock:
      if family_key(search) in self._families:
        return
    search.check_vocabulary(self._model.model_config.vocab_size)
    width = self.widths[-1]
    search_memory.check_search(self._model.model_configs, search, width=width,
                               rows=self.ladder[-1] // len(self.devices),
                               prefix_width=width, device=self.devices[0])

  def warm(self, search: SearchConfig | None = None, workers: int = 4) -> float:
    """Compiles (and runs once) every [rows, width] search the server will use for
    `search` (default: the server's), several at once; returns the seconds taken."""
    search = search or self.default_search
    start = time.perf_counter()
    shapes = [(rows, width) for rows in self.ladder for width in self.widths]
    scorer = self._translator(self.default_search, self.ladder[-1], None)
    samples = [self._sentence_of_width(width) for width in self.widths]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      runs = [pool.submit(self._run_once, search, (rows, width, self._forces))
              for rows, width in shapes]
      runs.append(pool.submit(scorer.score, samples, samples,  # One batch per width.
                              **self._warm))
      for run in runs:
        run.result()
    seconds = time.perf_counter() - start
    logging.info("Warmed %d search shapes (rows %s x widths %s) and scoring in %.1f s",
                 len(shapes), self.ladder, self.widths, seconds)
    return seconds

  # --- The search thread -------------------------------------------------------------------

  def _submit(self, job: Job) -> concurrent.futures.Future:
    with self._stats_lock:
      self.stats["requests"] += 1
      self.stats["sentences"] += len(job.sentences)
    if job.search is not None:  # Its option set is pinned until it is answered (or cancelled).
      key = family_key(job.search)
      with self._families_lock:
        self._waiting[key] += 1
      job.future.add_done_callback(lambda _: self._answered(key))
    self._queue.put(job)
    return job.future

  def _answered(self, key: SearchConfig) -> None:
    with self._families_lock:
      self._waiting[key] -= 1
      if not self._waiting[key]:
        del self._waiting[key]

  def _loop(self) -> None:
    while True:
      self._gather()
      dropped = self._pending.drop_done()  # Nobody waits for them: no search, no compile.
      scores, self._scores = self._scores, []
      live = [job for job in scores if not job.future.cancelled()]
      with self._stats_lock:
        self.stats["cancelled"] += (len(scores) - len(live)
                                    + sum(job.future.cancelled() for job in dropped))
      if live:
        self._guarded(live, self._score, live)
      if self._pending.count:
        self._search_next()

  def _gather(self) -> None:
    """Takes every request queued. With nothing pending, first waits for one, and then for
    more, up to max_batch sentences or for max_wait_s (requests sent together are
    searched together); with work pending, or sentences back from their compile, waits
    for none (they have waited: for the search, for their compile)."""
    if not self._pending.count and not self._scores:
      count = self._intake(first := self._queue.get())
      deadline = time.monotonic() + (0 if isinstance(first, list) else self.max_wait_s)
      while count < self.max_batch:
        try:
          entry = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
          break
        count += self._intake(entry)
    while True:
      try:
        self._intake(self._queue.get_nowait())
      except queue.Empty:
        return

  def _intake(self, entry: Job | list[Item]) -> int:
    """A request (a Job) or sentences back from their compile (Items) into the pending
    ones; returns the sentences it brought."""
    if isinstance(entry, list):
      self._pending.add(entry)
      return len(entry)
    if entry.kind == "score":
      self._scores.append(entry)
    elif entry.future.cancelled():  # Nobody waits for it: no search, no compile.
      with self._stats_lock:
        self.stats["cancelled"] += 1
    elif not entry.sentences:
      answer(entry.future, [])
    else:
      self._guarded([entry], self._pending.add_job, entry, self.width)
    return len(entry.sentences)

  def _search_next(self) -> None:
    """One search of the group holding the oldest sentence: its rows from `search_rows`,
    compiled first (on the compile thread) if its program has not run yet."""
    (search, given, width), waiting = self._pending.oldest()
    prefixed = given or self._forces
    with self._families_lock:
      family = self._family(search)
      ready = {rows for rows, w, p in family.ready if w == width and p == prefixed}
    more = self._pending.count > waiting or not self._queue.empty()
    rows = search_rows(waiting, self.ladder, ready, more)
    if rows not in ready:  # Every rung the group's sentences need, then the group again.
      items = self._pending.take((search, given, width), waiting)
      self._compile_then_requeue(search, {(r, width, prefixed) for r in needed_rows(
          waiting, self.ladder, ready)}, items)
      return
    items = self._pending.take((search, given, width), rows)
    self._guarded([item.job for item in items], self._search, search, rows, width, items)

  def _search(self, search: SearchConfig, rows: int, width: int, items: list[Item]) -> None:
    start, given = time.perf_counter(), items[0].job.prefixes is not None
    found = self._translator(search, rows, width).translate_nbest(
        [item.sentence for item in items],
        prefixes=[item.prefix for item in items] if given else None,
        **languages_of([direction(item.job, item.index) for item in items]))
    with self._stats_lock:
      self.stats["searches"] += 1
      self.stats["rows"] += rows
    deliver(items, found)
    logging.debug("Searched %d sentence(s) as [%d, %d] in %.1f ms; %d waiting", len(items),
                  rows, width, 1000 * (time.perf_counter() - start), self._pending.count)

  def _guarded(self, jobs: list[Job], run, *args) -> None:
    """run(*args); an error goes to `jobs`' requests, not to the search thread."""
    try:
      run(*args)
    except Exception as e:  # noqa: BLE001
      self._fail(list({id(job): job for job in jobs}.values()), e)

  def _fail(self, jobs: list[Job], error: BaseException) -> None:
    logging.error("%s of %d request(s) failed: %s", jobs[0].kind, len(jobs), error,
                  exc_info=error)
    for job in jobs:
      answer(job.future, error=error)

  def _compile_then_requeue(self, search: SearchConfig, keys: set[tuple[int, int, bool]],
                            items: list[Item]) -> None:
    """Compiles `keys`' programs on the compile thread (once, however many groups wait
    for them), then puts `items` back in the queue (or fails their requests with the
    compile's error)."""
    jobs = list({id(item.job): item.job for item in items}.values())
    with self._families_lock:
      family = self._family(search)
      for key in keys:
        family.waiters.setdefault(key, []).extend(jobs)
      futures = [family.compiling.get(key) for key in keys]
      futures = [future or family.compiling.setdefault(
                     key, self._compiler.submit(self._run_once, search, key))
                 for key, future in zip(keys, futures)]
    logging.info("Compiling %s for %d request(s), shapes (rows, width, prefixed) %s; "
                 "other requests are served meanwhile", search, len(jobs), sorted(keys))
    left, lock = [len(futures)], threading.Lock()

    def done(_):
      with lock:
        left[0] -= 1
        if left[0]:
          return
      error = next((f.exception() for f in futures if f.exception() is not None), None)
      if error is not None:
        self._fail(jobs, error)
      else:
        self._queue.put(items)

    for future in futures:
      future.add_done_callback(done)

  def _run_once(self, search: SearchConfig, key: tuple[int, int, bool]) -> None:
    """Compiles (or loads) and runs the program of `key` = (rows, width, prefixed) once;
    from then on it is ready. Skipped if every request waiting for it was cancelled."""
    rows, width, prefixed = key
    with self._families_lock:
      known = self._families.get(family_key(search))  # Not made more recently used.
      waiters = known.waiters.pop(key, []) if known else []  # None: warm()'s.
      if waiters and all(job.future.cancelled() for job in waiters):  # Requeued, dropped.
        known.compiling.pop(key, None)
        logging.info("Skipped compiling %s, shape (rows, width, prefixed) %s: its %d "
                     "request(s) were cancelled", search, key, len(waiters))
        return
      family = self._family(search)  # Dropped meanwhile? Its users find the key missing.
    sample = self._sentence_of_width(width)
    try:
      self._translator(search, rows, width).translate_nbest(
          [sample], prefixes=[""] if prefixed and not self._forces else None,
          **self._warm)
      with self._families_lock:
        family.ready.add(key)
    finally:  # A failed compile (a passing out-of-memory, say) is tried anew by the next.
      with self._families_lock:
        family.compiling.pop(key, None)
        family.waiters.pop(key, None)

  def _score(self, jobs: list[Job]) -> None:
    sources = [s for job in jobs for s in job.sentences]
    targets = [t for job in jobs for t in job.targets]
    directions = [direction(job, i) for job in jobs for i in range(len(job.sentences))]
    found = [{"logprob": logprob, "tokens": tokens} for logprob, tokens in
             self._translator(self.default_search, self.ladder[-1], None).score(
                 sources, targets, **languages_of(directions))]
    with self._stats_lock:
      self.stats["searches"] += 1
    start = 0
    for job in jobs:
      answer(job.future, found[start:start + len(job.sentences)])
      start += len(job.sentences)

  def _translator(self, search: SearchConfig, rows: int, width: int | None) -> Translator:
    """The Translator whose one batch shape is [rows, width] (width None: the model's
    token budget of rows x max_tokens, for scoring); kept per search options."""
    with self._families_lock:
      family = self._family(search)
      key = (rows, width)
      if key not in family.translators:
        # batch_tokens rows x width: translate_ids' batches at this width hold `rows` rows.
        budget = rows * (width or bucket_length(self.max_tokens, WIDTH_MULTIPLE))
        family.translators[key] = Translator(
            self._model.model_configs, self._params, self.tokenizer,
            dataclasses.replace(search, nbest=search.beam_size), batch_tokens=budget,
            devices=self.devices, checkpoint_steps=self._model.checkpoint_steps,
            whole_batches=True, languages=self._model.languages)
      return family.translators[key]

  def _family(self, search: SearchConfig) -> Family:
    """`search`'s family (made, and the least recently used idle other than the
    default's dropped beyond max_configs); the caller holds the lock. Its Translators'
    nbest is the beam: n-best lists are the beam's first nbest, so one program serves
    every nbest (callers cut the lists)."""
    search = family_key(search)
    family = self._families.get(search)
    if family is None:
      if len(self._families) >= self.max_configs:
        default = family_key(self.default_search)
        idle = [s for s, f in self._families.items()  # Oldest first.
                if s != default and not self._waiting[s] and not f.compiling]
        for dropped in idle[:len(self._families) - self.max_configs + 1]:
          del self._families[dropped]
          logging.info("Dropped the compiled searches of %s (over %d option sets)", dropped,
                       self.max_configs)
        if len(self._families) >= self.max_configs:
          logging.info("%d option sets have requests waiting: %s is compiled over the cap "
                       "of %d (--max_configs) until they are answered", len(self._families),
                       search, self.max_configs)
      family = self._families[search] = Family()
    self._families.move_to_end(search)
    return family

  def _sentence_of_width(self, width: int) -> str:
    """A sentence whose source is `width` - 15 .. `width` tokens long (for warming)."""
    for count in range(width, 0, -1):
      text = " ".join(["a"] * count)
      length = self.source_length(text)
      if length <= width:
        if length <= width - WIDTH_MULTIPLE:
          break
        return text
    raise ValueError(f"no warm-up sentence of width {width} for this vocabulary")
