"""Translation with a trained Transformer: text in, translations out.

`Translator` adds the vocabulary, length-bucketed batching and checkpoint loading
to the compiled searches of `programs` (`make_search_fn`, `make_score_fn`), for
notebooks and servers (decode.py is a thin shell over it).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flax_transformer import averaging
from flax_transformer import compilation
from flax_transformer import workdir as workdir_lib
from flax_transformer.data.tokenizer import Tokenizer
from flax_transformer.errors import ConfigError, DataError
from flax_transformer.languages import Languages
from flax_transformer.network.config import TransformerConfig
from flax_transformer.pretrained import tokenizers as _kinds  # noqa: F401  (registers the imported tokenizers' kinds)
from flax_transformer.translation import batching
from flax_transformer.translation.directions import Codes, Directions
from flax_transformer.translation import search_memory
from flax_transformer.translation.programs import (Members, as_members_of, member_configs,
                                                   compile_shapes_ahead, make_score_fn,
                                                   make_search_fn, search_batches,
                                                   search_per_shape, shard_score_fn,
                                                   shard_search_fn, translate_ids)
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation import sentences as sentences_lib


def _check_member(first: TransformerConfig, tokenizer: Tokenizer, member: TransformerConfig,
                  member_tokenizer: Tokenizer, first_path, path) -> None:
  """A DataError (one line) unless ensemble member `member` shares the first's vocabulary;
  one that holds as many ids padded to other rows is named as such: one imported before
  imports padded vocabularies for sharding (pretrained/vocab_padding.py), whose tokenizer
  files then differ by the added '<unused_N>' pieces alone."""
  rows = [(c.vocab_size, c.source_vocab) for c in (member, first)]
  real = {(c.without_vocab_padding().vocab_size, c.without_vocab_padding().source_vocab)
          for c in (member, first)}
  if rows[0] != rows[1] and len(real) == 1:
    raise DataError(
        f"ensemble: {path} and {first_path} hold the same {min(real)[0]} ids, padded "
        f"differently ({rows[0][0]} and {rows[1][0]} rows: one was imported before imports "
        "padded vocabularies to a multiple of 128 for sharding); members must have the "
        "same rows: use workdirs imported (or fine-tuned from imports) by one version")
  if not tokenizer.same_vocabulary(member_tokenizer):
    raise DataError(f"ensemble: {member_tokenizer.path} is not the vocabulary of "
                    f"{tokenizer.path}; members must share one vocabulary")


class Translator:
  """Text in, translations out: `Translator.from_workdir(DIR).translate(["A dog runs."])`.

  An ensemble when model_config and params are sequences (one entry per member,
  all trained with `tokenizer`'s vocabulary); inside, always a tuple of members.
  Each batch is split over `devices` (default: all of this process's), every
  device holding the whole model and searching (or scoring) its rows on its own
  (`shard_search_fn`).
  """

  def __init__(self, model_config: Members, params, tokenizer: Tokenizer,
               search: SearchConfig = SearchConfig(), *, batch_tokens: int = 4096,
               seed: int = 0, devices: Sequence[jax.Device] | None = None,
               checkpoint_steps: Sequence[Sequence[int]] | None = None,
               whole_batches: bool = False, languages: Languages = Languages()):
    self._setup(model_config, tokenizer, search, batch_tokens=batch_tokens, seed=seed,
                devices=devices, whole_batches=whole_batches, languages=languages)
    self._set_params(params, checkpoint_steps)

  def _set_params(self, params, checkpoint_steps: Sequence[Sequence[int]] | None) -> None:
    """The members' parameters, as given with the model config(s), placed on every device."""
    self.params = self._as_members(params)
    self.checkpoint_steps = tuple(checkpoint_steps) if checkpoint_steps is not None else None
    self._placed_params = jax.device_put(self.params, self._replicated)

  def _setup(self, model_config: Members, tokenizer: Tokenizer, search: SearchConfig, *,
             batch_tokens: int, seed: int, devices: Sequence[jax.Device] | None,
             whole_batches: bool = False, languages: Languages = Languages()) -> None:
    """Everything but the parameters: what compiling the searches needs.

    whole_batches: every batch has the rows `batch_tokens` gives its width (serve.py's
    batcher, whose shapes are compiled at start); False: a width whose sentences fill
    less than one batch gets only the rows they need (`search_batches`' fit_small).
    languages: what the model translates between (the workdir's record), which each
    call's source_lang/target_lang choose from (directions.py)."""
    self.whole_batches = whole_batches
    self.languages = languages
    self._directions = Directions(languages, tokenizer)
    # Normalised once: inside, a model is an ensemble of one.
    self.model_configs = tuple(c.replace(deterministic=True, decode=False)
                               for c in member_configs(model_config))
    self._as_members = as_members_of(model_config)
    self.model_config = self.model_configs[0]
    self.max_len = min(c.max_len for c in self.model_configs)
    self.tokenizer = tokenizer
    self.search = search
    self.batch_tokens = batch_tokens
    self.seed = seed
    self.devices = list(devices) if devices is not None else jax.local_devices()
    mesh = Mesh(np.asarray(self.devices), ("rows",))
    self._rows = NamedSharding(mesh, PartitionSpec("rows"))
    self._replicated = NamedSharding(mesh, PartitionSpec())
    self._search_fn = search_per_shape(
        jax.jit(shard_search_fn(make_search_fn(self.model_configs, search), mesh)), search)
    self._score_fn = compilation.PerShape(
        jax.jit(shard_score_fn(make_score_fn(self.model_configs), mesh)), "Scoring",
        key=lambda params, inputs, targets: (inputs, targets),
        describe=lambda params, inputs, targets: f"inputs {list(inputs.shape)}")

  @property
  def ensemble(self) -> bool:
    return len(self.model_configs) > 1

  def member(self, index: int = 0) -> tuple[TransformerConfig, Any]:
    """(model config, params) of one model (the only one unless an ensemble)."""
    return self.model_configs[index], self.params[index]

  @classmethod
  def from_workdir(cls, workdir: str | Path, *, search: SearchConfig = SearchConfig(),
                   ensemble: Sequence[str | Path] = (), average_last: int | None = 1,
                   checkpoint_step: int | None = None, batch_tokens: int = 4096,
                   seed: int = 0, devices: Sequence[jax.Device] | None = None,
                   compile_for: Sequence[str] | None = None,
                   compile_prefixes: Sequence[str] | None = None,
                   compilation_cache_dir: str | None = None,
                   whole_batches: bool = False) -> "Translator":
    """The model of a training workdir, its checkpoints averaged (paper: last 5 or 20).

    average_last: 1 (the newest checkpoint alone) here, where decode.py, serve.py and
    export.py pass their `--average_last` (default None: the last 5, the paper's
    base-model recipe, or as many as the workdir holds, without the warning a number
    asked for and not there gets).
    The class is what those tools build on: it loads what its caller names, and reading
    and averaging more checkpoints (each a full copy of the parameters in memory, 20
    for the paper's big model) is a choice of recipe the caller makes. Pass
    `average_last=5` to get decode.py's model.
    ensemble: more workdirs whose models vote with this one's (same vocabulary);
    average_last and checkpoint_step apply to each. `checkpoint_steps` of the
    result: per member, the steps averaged. compile_for (with compile_prefixes):
    the sentences the translator will first translate (`translate_nbest`'s
    arguments); their searches compile (`compile_ahead`) while the checkpoints
    load and average. compilation_cache_dir: the persistent compilation cache to
    enable ('' = the default location), once the arguments are checked and before
    anything compiles; None leaves jax's as it is. whole_batches: as the constructor's.
    """
    configs, tokenizer = [], None
    paths = (workdir, *ensemble)
    for path in paths:
      model_config, member_tokenizer = workdir_lib.read_run(path)
      if tokenizer is None:
        tokenizer = member_tokenizer
      else:
        _check_member(configs[0], tokenizer, model_config, member_tokenizer, paths[0], path)
      configs.append(model_config)
    averaging.check_average_last(average_last)  # Before any compile is queued,
    search.check_vocabulary(configs[0].vocab_size)  # or anything is logged.
    if compilation_cache_dir is not None:
      compilation.enable_cache(compilation_cache_dir)
    translator = cls.__new__(cls)
    translator._setup(configs, tokenizer, search, batch_tokens=batch_tokens, seed=seed,
                      devices=devices, whole_batches=whole_batches,
                      languages=workdir_lib.languages(workdir))
    if compile_for is not None:
      translator.compile_ahead(compile_for, compile_prefixes)
    all_params, all_steps = [], []
    try:
      for path, model_config in zip(paths, configs):
        params, steps = averaging.load_params(path, model_config,
                                                checkpoint_step=checkpoint_step,
                                                average_last=average_last)
        logging.info("Loaded %s from checkpoint step(s) %s", path, steps)
        all_params.append(params)
        all_steps.append(steps)
    except BaseException:
      translator._search_fn.cancel_pending()  # It exits now, not after each queued compile.
      raise
    translator._set_params(all_params, all_steps)
    return translator

  def compile_ahead(self, sentences: Sequence[str], prefixes: Sequence[str] | None = None,
                    source_lang: Codes = None, target_lang: Codes = None) -> None:
    """Starts compiling, on a background thread, the searches that
    `translate_nbest(sentences, prefixes=prefixes)` will run: from the parameters'
    shapes, dtypes and shardings alone (those set, else `averaging.abstract_params`),
    so they may still be loading. That call then waits for each program instead of
    compiling it. Prefixes that `translate_nbest` would refuse compile nothing here
    (it raises there)."""
    try:
      _, sources, prefix_ids, _ = self._searched(sentences, prefixes, source_lang, target_lang)
    except (DataError, ConfigError):
      return
    if not sources:
      return
    batches = search_batches(sources, batch_tokens=self.batch_tokens, max_length=self.max_len,
                             row_multiple=len(self.devices), prefixes=prefix_ids,
                             fit_small=not self.whole_batches)
    for batch in batches:  # Refused here, in this thread, not by the compile behind it.
      search_memory.check_search(
          self.model_configs, self.search, rows=len(batch["inputs"]) // len(self.devices),
          width=batch["inputs"].shape[1], device=self.devices[0],
          prefix_width=None if prefix_ids is None else batch["targets"].shape[1])
    # The parameters set, as given (boxed, cast), else the shapes a checkpoint loads as.
    members = getattr(self, "_placed_params", None)
    if members is None:
      members = tuple(averaging.abstract_params(c) for c in self.model_configs)
    params = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self._replicated), members)
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))

    def placed(x: np.ndarray) -> jax.ShapeDtypeStruct:  # What `_place` would make of x.
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self._rows)

    def arguments(batch):  # As `translate_ids` calls the search.
      forced = (placed(batch["targets"]),) if prefix_ids is not None else ()
      return (params, placed(batch["inputs"]), key, *forced)

    compile_shapes_ahead(self._search_fn, [(batch["inputs"].shape,
                                            functools.partial(arguments, batch))
                                           for batch in batches])

  def _place(self, batch: np.ndarray) -> jax.Array:
    return jax.device_put(batch, self._rows)

  def _check_prefixes(self, prefixes: Sequence[np.ndarray], count: int) -> None:
    """A DataError naming the first prefix (ids) that cannot fit the model's outputs."""
    if len(prefixes) != count:
      raise DataError(f"{len(prefixes)} prefixes for {count} sentences")
    for i, prefix in enumerate(prefixes):
      if len(prefix) >= self.max_len:
        raise DataError(f"line {i + 1}: the prefix has {len(prefix)} tokens; the model's "
                        f"outputs hold at most {self.max_len - 1} before their EOS")

  def translate_nbest_ids(self, sources: Sequence[np.ndarray],
                          prefixes: Sequence[np.ndarray] | None = None, progress=None
                          ) -> list[list[tuple[list[int], float]]]:
    """Token ids in (EOS-terminated), per source `search.nbest` (ids without EOS, score)
    pairs out, best first. prefixes: per source, the ids (no EOS, may be empty) every
    hypothesis starts with; the score counts their log-probability too."""
    if prefixes is not None:
      self._check_prefixes(prefixes, len(sources))
    return translate_ids(self._search_fn, self._placed_params, sources,
                         batch_tokens=self.batch_tokens, max_length=self.max_len,
                         row_multiple=len(self.devices), nbest=self.search.nbest,
                         seed=self.seed, place=self._place, progress=progress, prefixes=prefixes,
                         fit_small=not self.whole_batches)

  def translate_nbest(self, sentences: Sequence[str], progress=None,
                      prefixes: Sequence[str] | None = None, source_lang: Codes = None,
                      target_lang: Codes = None) -> list[list[tuple[str, float]]]:
    """Per sentence, `search.nbest` (translation, score) pairs, best first.

    prefixes: per sentence, the text its translations start with (tokenized as
    targets are; '' forces nothing); the score then includes the prefix's
    log-probability. Empty (or all-whitespace) sentences without a prefix are not
    searched: their `search.nbest` hypotheses are all '' with score 0 (as many as any
    sentence's, so n-best output keeps K lines per input). source_lang, target_lang:
    a code for every sentence, or one per sentence (a batch may mix targets), from
    `languages`; None: the model's only one. A pair the model does not translate is
    an UnknownLanguageError naming those it does.
    """
    todo, sources, prefix_ids, rows = self._searched(sentences, prefixes, source_lang,
                                                     target_lang)
    results: list[list[tuple[str, float]]] = [[("", 0.0)] * self.search.nbest
                                              for _ in sentences]
    if todo:
      found = self.translate_nbest_ids(sources, prefix_ids, progress)
      written = self._directions.written
      for i, hyps in zip(todo, found):
        results[i] = [(self.tokenizer.target.detokenize(written(h, rows[i][1])), score)
                      for h, score in hyps]
    return results

  def _searched(self, sentences: Sequence[str], prefixes: Sequence[str] | None,
                source_lang: Codes = None, target_lang: Codes = None):
    """(indices of the sentences searched, their ids, their forced ids or None, each
    sentence's (source, target)): empty sentences without a prefix are not searched."""
    rows = self._directions.resolve(len(sentences), source_lang, target_lang)
    texts = self._directions.source_texts(sentences, rows)
    ids = [self.tokenizer.source.tokenize(s) for s in texts]
    prefix_ids = None
    if prefixes is not None:  # Tokenized as targets are, without their EOS.
      prefix_ids = [self.tokenizer.target.tokenize(p)[:-1] for p in prefixes]
      self._check_prefixes(prefix_ids, len(sentences))
    todo = [i for i, s in enumerate(sentences)
            if s.strip() or (prefix_ids is not None and len(prefix_ids[i]))]
    forced = self._directions.forced(rows, prefix_ids)
    if forced is not None:
      self._check_prefixes(forced, len(sentences))
    return (todo, [ids[i] for i in todo],
            None if forced is None else [forced[i] for i in todo], rows)

  def translate(self, sentences: Sequence[str], progress=None,
                prefixes: Sequence[str] | None = None, source_lang: Codes = None,
                target_lang: Codes = None) -> list[str]:
    """One translation per sentence, in order (prefixes, languages: as `translate_nbest`)."""
    return [hyps[0][0] for hyps in self.translate_nbest(sentences, progress, prefixes,
                                                        source_lang, target_lang)]

  def translate_texts(self, texts: Sequence[str], language: str, progress=None,
                      target_lang: str | None = None) -> list[str]:
    """One translation per text, each split into sentences by `language`'s rules
    (sentences.py, sentencex), the sentences translated together, each text joined back
    with its own whitespace and newlines; a sentence over the model's max_len is cut at
    it, with a warning, and translated in pieces (decode.py --split_sentences): measured
    as the model reads it, an OPUS-MT target's >>xx<< tag or a source token included.
    URLs, e-mail addresses, mentions, emoji and words with a character the vocabulary
    cannot spell come back as they were, in place (sentences.layout).
    `language` is the source's (source_lang), target_lang as `translate_nbest`'s."""
    source = self.languages.model_code(language, self.languages.sources)  # en: eng_Latn.
    direction = dict(source_lang=source if source in self.languages.sources else None,
                     target_lang=target_lang)
    row = self._directions.resolve(1, **direction)
    inputs, layouts = sentences_lib.layout(texts, language, self.max_len, lambda s: len(
        self.tokenizer.source.tokenize(self._directions.source_texts([s], row)[0])),
        unknown=sentences_lib.Unknown(self.tokenizer.source))
    return sentences_lib.join(layouts, self.translate(inputs, progress, **direction))

  def score(self, sources: Sequence[str], targets: Sequence[str], progress=None,
            source_lang: Codes = None, target_lang: Codes = None) -> list[tuple[float, int]]:
    """Per (source, target) pair: (log P(target | source), target tokens), EOS included.

    Under the model, or the ensemble (per token, the log of the mean of its
    members' probabilities). One teacher-forced forward pass per length-bucketed
    batch, split over the devices as the search is. Sources longer than max_len
    are truncated (logged); a target that long is a DataError naming its line. The
    languages as `translate_nbest`'s: a forced target token counts in the score.
    """
    if len(sources) != len(targets):
      raise DataError(f"{len(targets)} targets for {len(sources)} sources")
    rows = self._directions.resolve(len(sources), source_lang, target_lang)
    texts = self._directions.source_texts(sources, rows)
    target_ids = [self.tokenizer.target.tokenize(t) for t in targets]
    if self._directions.forces_target:
      target_ids = [np.concatenate([f, t]) for f, t in
                    zip(self._directions.forced(rows, None), target_ids)]
    return self.score_ids([self.tokenizer.source.tokenize(s) for s in texts], target_ids,
                          progress)

  def score_ids(self, sources: Sequence[np.ndarray], targets: Sequence[np.ndarray],
                progress=None) -> list[tuple[float, int]]:
    """`score` of token ids, each sequence EOS-terminated (as `Tokenizer.tokenize` gives)."""
    if len(sources) != len(targets):
      raise DataError(f"{len(targets)} targets for {len(sources)} sources")
    pairs = list(zip(sources, targets))
    for i, (_, target) in enumerate(pairs):
      if len(target) > self.max_len:
        raise DataError(f"line {i + 1}: the target has {len(target)} tokens (EOS included), "
                        f"more than the model's max_len of {self.max_len}")
    batches = list(batching.eval_batches(pairs, batch_tokens=self.batch_tokens,
                                         max_length=self.max_len,
                                         row_multiple=len(self.devices),
                                         fit_small=not self.whole_batches))

    def arguments(batch):
      return self._placed_params, self._place(batch["inputs"]), self._place(batch["targets"])

    compile_shapes_ahead(self._score_fn, [(batch["inputs"].shape,
                                           functools.partial(arguments, batch))
                                          for batch in batches])
    results: list[tuple[float, int]] = [(0.0, 0)] * len(pairs)
    for batch in batches:
      sums, counts = jax.device_get(self._score_fn(*arguments(batch)))
      for row, index in enumerate(batch["index"]):
        if index >= 0:
          results[index] = (float(sums[row]), int(counts[row]))
      if progress is not None:
        progress.update(int((batch["index"] >= 0).sum()))
    return results
