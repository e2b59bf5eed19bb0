"""Translation with a trained Transformer: jitted beam search over batches of text.

`make_search_fn` glues the model to the model-agnostic search in `search`, and
`make_score_fn` scores given targets (teacher-forced); `Translator` adds the
vocabulary, length-bucketed batching and checkpoint loading, for notebooks and
servers (decode.py is a thin shell over it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flax_transformer import compilation
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, trim
from flax_transformer.errors import ConfigError, DataError
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.model import Transformer, init_cache
from flax_transformer import averaging
from flax_transformer import workdir as workdir_lib
from flax_transformer.translation import batching
from flax_transformer.translation import search as search_lib


MAX_ALPHA = 10.0
TEMPERATURES = (1e-3, 100.0)  # A sampling temperature's range.


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """How to search: beam (beam_size > 1 or temperature 0 with beam_size 1) or sampling.

  max_extra: outputs may be up to source length + max_extra tokens (paper: 50; 0: no
  longer than the source), capped by the model's max_len. nbest: hypotheses returned
  per sentence (1 when sampling: a draw is one hypothesis).

  The one check of search options (decode.py's, serve.py's and export.py's flags,
  serve's requests, the API): an option out of range is a ConfigError naming it.
  alpha in [0, 10]: below 0 the early stop's bound on live beams fails (a sentence's
  n-best could depend on its batch-mates), so it is refused, not searched; 10 keeps
  ((5 + |Y|) / 6)^alpha finite in float32 for outputs of thousands of tokens.
  temperature 0 (beam search, or greedy with beam_size 1) or in [0.001, 100]: below,
  sampling is all but greedy; above, all but uniform over the vocabulary (and from
  about 1e5 the pad and length bans, log-prob -1e7 divided by the temperature, fail).
  top_k in [0, the vocabulary] (0: every token; the vocabulary's bound is
  `check_vocabulary`'s), top_p in (0, 1].
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_extra: int = 50
  nbest: int = 1
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  # Beam search: a hypothesis ends (takes EOS) only as one of a step's beam_size best
  # candidates, as transformers' generate and fairseq have it; False: as any of the
  # 2 x beam_size the step considers (search.beam_search).
  eos_within_beam: bool = False

  def __post_init__(self):
    # `not a <= x <= b`, not `x < a or x > b`: NaN is refused too.
    if not self.beam_size >= 1:
      raise ConfigError(f"beam_size must be >= 1, got {self.beam_size}")
    if not 1 <= self.nbest <= self.beam_size:
      raise ConfigError(f"nbest must be in [1, beam_size={self.beam_size}], got {self.nbest}")
    if not 0 <= self.alpha <= MAX_ALPHA:
      raise ConfigError(f"alpha must be in [0, {MAX_ALPHA:g}], got {self.alpha}")
    if not self.max_extra >= 0:
      raise ConfigError(f"max_extra must be >= 0, got {self.max_extra}")
    if not (self.temperature == 0 or TEMPERATURES[0] <= self.temperature <= TEMPERATURES[1]):
      raise ConfigError(f"temperature must be 0 (beam search; greedy with beam_size 1) or in "
                        f"[{TEMPERATURES[0]:g}, {TEMPERATURES[1]:g}], got {self.temperature}")
    if self.temperature > 0 and self.nbest > 1:
      raise ConfigError(f"nbest must be 1 when sampling (temperature > 0): each draw is one "
                        f"hypothesis, got {self.nbest}")
    if not self.top_k >= 0:
      raise ConfigError(f"top_k must be >= 0 (0 = every token), got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

  def check_vocabulary(self, vocab_size: int) -> None:
    """The check that needs the model: top_k at most its vocabulary."""
    if self.top_k > vocab_size:
      raise ConfigError(f"top_k must be at most the vocabulary's {vocab_size} tokens "
                        f"(0 = every token), got {self.top_k}")


Members = TransformerConfig | Sequence[TransformerConfig]


def _members(model_config: Members) -> tuple[TransformerConfig, ...]:
  """One config -> (config,); an ensemble's configs -> a tuple (all the same vocabulary)."""
  if isinstance(model_config, TransformerConfig):
    return (model_config,)
  configs = tuple(model_config)
  if not configs:
    raise ValueError("an ensemble needs at least one model config")
  sizes = {c.vocab_size for c in configs}
  if len(sizes) > 1:
    raise ValueError(f"ensemble members have different vocab_size: {sorted(sizes)}")
  return configs


def _as_members_of(model_config: Members) -> Callable[[Any], tuple]:
  """Parameters as given alongside `model_config` -> one entry per member, as a tuple."""
  if isinstance(model_config, TransformerConfig):
    return lambda params: (params,)
  return tuple


def _check_members(configs, members_params) -> None:
  if len(members_params) != len(configs):  # zip would drop members silently.
    raise ValueError(f"{len(configs)} model configs but {len(members_params)} parameter sets")


def make_search_fn(model_config: Members, search: SearchConfig
                   ) -> Callable[..., search_lib.SearchResult]:
  """(params, inputs int [B, S], rng[, prefix int [B, P]]) -> SearchResult; jit it.

  Given a sequence of configs (an ensemble), params is the matching sequence and
  each step's distribution is the mean of the members' probabilities. prefix
  (P >= 1): each row's forced target prefix, 0-padded, no EOS; its lengths are
  data, so one program serves every prefix up to P tokens.
  """
  configs = _members(model_config)
  search.check_vocabulary(configs[0].vocab_size)
  as_members = _as_members_of(model_config)
  encoders = [Transformer(c.replace(deterministic=True, decode=False)) for c in configs]
  decoders = [Transformer(c.replace(deterministic=True, decode=True)) for c in configs]
  max_len = min(c.max_len for c in configs)

  def search_fn(params, inputs, rng, prefix=None):
    batch, source_len = inputs.shape
    forced = {}
    if prefix is None:
      max_decode_len = min(source_len + search.max_extra, max_len)
    else:
      # Room for the longest prefix and at least its EOS.
      max_decode_len = min(max(source_len, prefix.shape[1]) + max(search.max_extra, 1), max_len)
      forced = dict(forced_ids=prefix,
                    forced_lengths=(prefix != PAD_ID).sum(axis=1).astype(jnp.int32))
    source_lengths = (inputs != 0).sum(axis=1)
    # A filler row (all padding, completing a batch's compiled shape) ends at once:
    # left open, it would babble to max_extra tokens and hold its batch's loop open.
    max_lengths = jnp.where(source_lengths > 0,
                            jnp.minimum(source_lengths + search.max_extra, max_decode_len), 1)
    sampling = search.temperature > 0 or search.beam_size == 1
    rows = 1 if sampling else search.beam_size
    members_params = as_members(params)
    _check_members(configs, members_params)
    steps, caches = zip(*(
        _member_step(config, encoder, decoder, member_params, inputs, rows, max_decode_len)
        for config, encoder, decoder, member_params
        in zip(configs, encoders, decoders, members_params)))
    if len(steps) > 1:
      tokens_to_logits, cache = _mean_of_probabilities(steps), tuple(caches)
    else:
      tokens_to_logits, cache = steps[0], caches[0]

    if sampling:
      return search_lib.sample_search(
          tokens_to_logits, cache, batch_size=batch, max_decode_len=max_decode_len,
          eos_id=EOS_ID, temperature=search.temperature, top_k=search.top_k,
          top_p=search.top_p, rng=rng, max_lengths=max_lengths, **forced)
    return search_lib.beam_search(
        tokens_to_logits, cache, batch_size=batch, beam_size=search.beam_size,
        max_decode_len=max_decode_len, alpha=search.alpha, eos_id=EOS_ID,
        max_lengths=max_lengths, eos_within_beam=search.eos_within_beam, **forced)

  return search_fn


def make_score_fn(model_config: Members) -> Callable[[Any, jax.Array, jax.Array],
                                                     tuple[jax.Array, jax.Array]]:
  """(params, inputs int [B, S], targets int [B, T]) -> (log P(targets | inputs) float32 [B],
  target tokens int32 [B]): one teacher-forced forward pass; jit it.

  targets: EOS-terminated, 0-padded; the sum runs over their non-pad tokens, EOS
  included. An ensemble's (params a sequence as in `make_search_fn`) per-token
  probability is the mean of its members', as in its search.
  """
  configs = _members(model_config)
  as_members = _as_members_of(model_config)
  models = [Transformer(c.replace(deterministic=True, decode=False)) for c in configs]

  def score_fn(params, inputs, targets):
    members_params = as_members(params)
    _check_members(configs, members_params)
    logits = [model.apply({"params": member_params}, inputs, targets)
              for model, member_params in zip(models, members_params)]
    log_probs = _log_mean_probabilities(logits)
    token_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    real = targets != PAD_ID
    return jnp.where(real, token_log_probs, 0.0).sum(axis=1), real.sum(axis=1).astype(jnp.int32)

  return score_fn


def search_per_shape(jitted_search, search: SearchConfig, *, max_shapes: int | None = None,
              context=contextlib.nullcontext) -> compilation.PerShape:
  """A jitted search compiled once per input shape, each compile logged by name."""
  sampling = search.temperature > 0 or search.beam_size == 1
  return compilation.PerShape(
      jitted_search, "Sampling" if sampling else "Beam search", max_shapes=max_shapes,
      key=lambda params, inputs, rng, *prefix: (inputs, *prefix),
      describe=lambda params, inputs, rng, *prefix: f"inputs {list(inputs.shape)}" + "".join(
          f", prefixes {list(p.shape)}" for p in prefix), context=context)


def batch_keys(seed: int, count: int) -> list[jax.Array]:
  """The search key of each of `count` batches (sampling draws from them)."""
  rng, keys = jax.random.PRNGKey(seed), []
  for _ in range(count):
    rng, key = jax.random.split(rng)
    keys.append(key)
  return keys


def search_batches(sources: Sequence[np.ndarray], *, batch_tokens: int, max_length: int,
                   row_multiple: int = 1, max_widths: int | None = None,
                   prefixes: Sequence[np.ndarray] | None = None, fit_small: bool = True
                   ) -> list[dict[str, np.ndarray]]:
  """The host batches `translate_ids` searches: `inputs` [rows, width], `index` [rows];
  with `prefixes` (ids without EOS, one per source), `targets` [rows, width] holds them.
  fit_small: a width's batch only as large as its sentences need when they fill less
  than one (`batching.eval_batches`: never more shapes than whole batches)."""
  empty = np.zeros((0,), np.int32)
  pairs = list(zip(sources, prefixes if prefixes is not None else [empty] * len(sources)))
  return list(batching.eval_batches(pairs, batch_tokens=batch_tokens, max_length=max_length,
                                    row_multiple=row_multiple, max_widths=max_widths,
                                    fit_small=fit_small))


def shard_search_fn(search_fn: Callable[..., search_lib.SearchResult],
                    mesh: Mesh) -> Callable[..., search_lib.SearchResult]:
  """`search_fn` run independently on every device of `mesh`, each on its share of rows.

  (params, inputs int [B, S], rng[, prefix int [B, P]]) -> SearchResult, with B
  divisible by mesh.size; params are replicated. Each device runs its own while loop, so nothing crosses
  devices during the search (a search jitted over a sharded batch agrees on its
  stopping test across devices at every step), and on a CPU host each core runs
  its own search (BENCHMARKS.md). Sampling draws from `rng` folded with the device
  index, so samples depend on the number of devices; beam search does not.
  """
  axes = tuple(mesh.axis_names)

  def per_device(params, inputs, rng, *prefix):
    return search_fn(params, inputs, jax.random.fold_in(rng, jax.lax.axis_index(axes)), *prefix)

  def sharded(params, inputs, rng, *prefix):
    return jax.shard_map(per_device, mesh=mesh,
                         in_specs=(PartitionSpec(), PartitionSpec(axes), PartitionSpec())
                         + (PartitionSpec(axes),) * len(prefix),
                         out_specs=PartitionSpec(axes),
                         # The self-attention cache starts as constants and is written
                         # with per-device values: types differ in varying axes only.
                         check_vma=False)(params, inputs, rng, *prefix)

  return sharded


def shard_score_fn(score_fn, mesh: Mesh):
  """`score_fn` (`make_score_fn`) on every device of `mesh`, each on its share of rows."""
  axes = tuple(mesh.axis_names)
  return jax.shard_map(score_fn, mesh=mesh,
                       in_specs=(PartitionSpec(), PartitionSpec(axes), PartitionSpec(axes)),
                       out_specs=PartitionSpec(axes))


def _member_step(model_config, encoder, decoder, params, inputs, rows, max_decode_len):
  """One model's (tokens_to_logits, initial cache) for `rows` hypotheses per sentence."""
  encoded = encoder.apply({"params": params}, inputs, method=Transformer.encode)
  # The encoder runs once per sentence; beams share its output (and, with
  # share_beam_cache, the whole decoding cache) instead of copies.
  cache = init_cache(model_config, params, encoded, max_decode_len, beam_size=rows)
  if not model_config.share_beam_cache:
    encoded, inputs = search_lib.repeat_beams(encoded, rows), search_lib.repeat_beams(inputs, rows)

  def tokens_to_logits(ids, cache):
    logits, updated = decoder.apply({"params": params, "cache": cache}, encoded, inputs, ids,
                                    method=Transformer.decode, mutable=["cache"])
    return logits[:, 0], updated["cache"]

  return tokens_to_logits, cache


def _log_mean_probabilities(logits: Sequence[jax.Array]) -> jax.Array:
  """Members' logits [..., V] -> log of the mean of their softmaxes [..., V] (one: its
  log-softmax)."""
  log_probs = [jax.nn.log_softmax(x.astype(jnp.float32)) for x in logits]
  if len(log_probs) == 1:
    return log_probs[0]
  return jax.scipy.special.logsumexp(jnp.stack(log_probs), axis=0) - np.log(len(log_probs))


def _mean_of_probabilities(steps: Sequence[search_lib.TokensToLogits]) -> search_lib.TokensToLogits:
  """Members' tokens_to_logits -> the ensemble's: log of the mean of their softmaxes."""

  def tokens_to_logits(ids, caches):
    outs = [step(ids, cache) for step, cache in zip(steps, caches)]
    return (_log_mean_probabilities([logits for logits, _ in outs]),
            tuple(cache for _, cache in outs))

  return tokens_to_logits


def compile_shapes_ahead(fn, calls: Sequence[tuple[tuple, Callable[[], tuple]]]) -> None:
  """Starts compiling `fn` (a `compilation.PerShape`) for every shape at once, not one
  per first use. calls: (host batch shape, () -> that call's arguments) per call; only
  the first call of each shape is placed."""
  if not hasattr(fn, "compile_ahead"):
    return
  firsts: dict[tuple, Callable[[], tuple]] = {}
  for shape, arguments in calls:
    firsts.setdefault(shape, arguments)
  for arguments in firsts.values():
    fn.compile_ahead(*arguments())


def translate_ids(search_fn, params, sources: Sequence[np.ndarray], *, batch_tokens: int,
                  max_length: int, row_multiple: int = 1, nbest: int = 1, seed: int = 0,
                  place: Callable[[np.ndarray], Any] = jnp.asarray,
                  progress=None, max_widths: int | None = None,
                  prefixes: Sequence[np.ndarray] | None = None,
                  stop: Callable[[], bool] | None = None, fit_small: bool = True):
  """Token ids of each source -> per source, `nbest` (ids, score) pairs, best first.

  Sources are sorted by length into token-budgeted batches (few compiled
  shapes, at most `max_widths`) and returned in their original order. `place`
  puts a host batch on the devices (e.g. sharded over the mesh's data axes);
  `progress.update(n)` (a tqdm bar, say) hears of every n sentences done.
  prefixes: per source, the target ids every hypothesis starts with (no EOS;
  may be empty), searched with a program of their own per shape.
  stop: asked before each batch; once true, the search ends there, and the sources
  not searched yet stay None (a training run's evaluation that a SIGTERM cuts short).
  """
  results: list[Any] = [None] * len(sources)
  batches = search_batches(sources, batch_tokens=batch_tokens, max_length=max_length,
                           row_multiple=row_multiple, max_widths=max_widths, prefixes=prefixes,
                           fit_small=fit_small)
  keys = batch_keys(seed, len(batches))

  def arguments(batch, key):
    forced = (place(batch["targets"]),) if prefixes is not None else ()
    return (params, place(batch["inputs"]), key, *forced)

  compile_shapes_ahead(search_fn, [(batch["inputs"].shape, functools.partial(arguments, batch, key))
                                   for batch, key in zip(batches, keys)])
  for batch, key in zip(batches, keys):
    if stop is not None and stop():
      break
    out = search_fn(*arguments(batch, key))
    sequences, scores = jax.device_get((out.sequences, out.scores))
    for row, index in enumerate(batch["index"]):
      if index >= 0:
        results[index] = [(trim(sequences[row, j]), float(scores[row, j]))
                          for j in range(min(nbest, sequences.shape[1]))]
    if progress is not None:
      progress.update(int((batch["index"] >= 0).sum()))
  return results


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
               whole_batches: bool = False):
    self._setup(model_config, tokenizer, search, batch_tokens=batch_tokens, seed=seed,
                devices=devices, whole_batches=whole_batches)
    self._set_params(params, checkpoint_steps)

  def _set_params(self, params, checkpoint_steps: Sequence[Sequence[int]] | None) -> None:
    """The members' parameters, as given with the model config(s), placed on every device."""
    self.params = self._as_members(params)
    self.checkpoint_steps = tuple(checkpoint_steps) if checkpoint_steps is not None else None
    self._placed_params = jax.device_put(self.params, self._replicated)

  def _setup(self, model_config: Members, tokenizer: Tokenizer, search: SearchConfig, *,
             batch_tokens: int, seed: int, devices: Sequence[jax.Device] | None,
             whole_batches: bool = False) -> None:
    """Everything but the parameters: what compiling the searches needs.

    whole_batches: every batch has the rows `batch_tokens` gives its width (serve.py's
    batcher, whose shapes are compiled at start); False: a width whose sentences fill
    less than one batch gets only the rows they need (`search_batches`' fit_small)."""
    self.whole_batches = whole_batches
    # Normalised once: inside, a model is an ensemble of one.
    self.model_configs = tuple(c.replace(deterministic=True, decode=False)
                               for c in _members(model_config))
    self._as_members = _as_members_of(model_config)
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
                   ensemble: Sequence[str | Path] = (), average_last: int = 1,
                   checkpoint_step: int | None = None, batch_tokens: int = 4096,
                   seed: int = 0, devices: Sequence[jax.Device] | None = None,
                   compile_for: Sequence[str] | None = None,
                   compile_prefixes: Sequence[str] | None = None,
                   compilation_cache_dir: str | None = None,
                   whole_batches: bool = False) -> "Translator":
    """The model of a training workdir, its checkpoints averaged (paper: last 5 or 20).

    average_last: 1 (the newest checkpoint alone) here, where decode.py, serve.py and
    export.py pass their `--average_last` (default 5, the paper's base-model recipe).
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
      elif not tokenizer.same_vocabulary(member_tokenizer):
        raise DataError(f"ensemble: {member_tokenizer.path} is not the vocabulary of "
                        f"{tokenizer.path}; members must share one vocabulary")
      configs.append(model_config)
    averaging.check_average_last(average_last)  # Before any compile is queued,
    search.check_vocabulary(configs[0].vocab_size)  # or anything is logged.
    if compilation_cache_dir is not None:
      compilation.enable_cache(compilation_cache_dir)
    translator = cls.__new__(cls)
    translator._setup(configs, tokenizer, search, batch_tokens=batch_tokens, seed=seed,
                      devices=devices, whole_batches=whole_batches)
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

  def compile_ahead(self, sentences: Sequence[str], prefixes: Sequence[str] | None = None
                    ) -> None:
    """Starts compiling, on a background thread, the searches that
    `translate_nbest(sentences, prefixes=prefixes)` will run: from the parameters'
    shapes, dtypes and shardings alone (those set, else `averaging.abstract_params`),
    so they may still be loading. That call then waits for each program instead of
    compiling it. Prefixes that `translate_nbest` would refuse compile nothing here
    (it raises there)."""
    try:
      _, sources, prefix_ids = self._searched(sentences, prefixes)
    except DataError:
      return
    if not sources:
      return
    batches = search_batches(sources, batch_tokens=self.batch_tokens, max_length=self.max_len,
                             row_multiple=len(self.devices), prefixes=prefix_ids,
                             fit_small=not self.whole_batches)
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
                      prefixes: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
    """Per sentence, `search.nbest` (translation, score) pairs, best first.

    prefixes: per sentence, the text its translations start with (tokenized as
    targets are; '' forces nothing); the score then includes the prefix's
    log-probability. Empty (or all-whitespace) sentences without a prefix are not
    searched: their `search.nbest` hypotheses are all '' with score 0 (as many as any
    sentence's, so n-best output keeps K lines per input).
    """
    todo, sources, prefix_ids = self._searched(sentences, prefixes)
    results: list[list[tuple[str, float]]] = [[("", 0.0)] * self.search.nbest
                                              for _ in sentences]
    if todo:
      found = self.translate_nbest_ids(sources, prefix_ids, progress)
      for i, hyps in zip(todo, found):
        results[i] = [(self.tokenizer.target.detokenize(h), score) for h, score in hyps]
    return results

  def _searched(self, sentences: Sequence[str], prefixes: Sequence[str] | None):
    """(indices of the sentences searched, their ids, their prefixes' ids or None):
    empty sentences without a prefix are not searched."""
    ids = [self.tokenizer.source.tokenize(s) for s in sentences]
    prefix_ids = None
    if prefixes is not None:  # Tokenized as targets are, without their EOS.
      prefix_ids = [self.tokenizer.target.tokenize(p)[:-1] for p in prefixes]
      self._check_prefixes(prefix_ids, len(sentences))
    todo = [i for i, s in enumerate(sentences)
            if s.strip() or (prefix_ids is not None and len(prefix_ids[i]))]
    return (todo, [ids[i] for i in todo],
            None if prefix_ids is None else [prefix_ids[i] for i in todo])

  def translate(self, sentences: Sequence[str], progress=None,
                prefixes: Sequence[str] | None = None) -> list[str]:
    """One translation per sentence, in order (prefixes: as `translate_nbest`)."""
    return [hyps[0][0] for hyps in self.translate_nbest(sentences, progress, prefixes)]

  def score(self, sources: Sequence[str], targets: Sequence[str], progress=None
            ) -> list[tuple[float, int]]:
    """Per (source, target) pair: (log P(target | source), target tokens), EOS included.

    Under the model, or the ensemble (per token, the log of the mean of its
    members' probabilities). One teacher-forced forward pass per length-bucketed
    batch, split over the devices as the search is. Sources longer than max_len
    are truncated (logged); a target that long is a DataError naming its line.
    """
    return self.score_ids([self.tokenizer.source.tokenize(s) for s in sources],
                          [self.tokenizer.target.tokenize(t) for t in targets], progress)

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
