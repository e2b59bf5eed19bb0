"""The compiled search and score functions: the model glued to the model-agnostic
search in `search` (`make_search_fn`), teacher-forced scoring (`make_score_fn`), one
search per device (`shard_search_fn`), and the host loop over length-bucketed
batches (`translate_ids`) that `Translator` and in-training BLEU run.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from flax_transformer import compilation
from flax_transformer.data.tokenizer import EOS_ID, PAD_ID, trim
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.model import Transformer, init_cache
from flax_transformer.translation import batching
from flax_transformer.translation import search as search_lib
from flax_transformer.translation import search_memory
from flax_transformer.translation.search_config import SearchConfig


Members = TransformerConfig | Sequence[TransformerConfig]


def member_configs(model_config: Members) -> tuple[TransformerConfig, ...]:
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


def as_members_of(model_config: Members) -> Callable[[Any], tuple]:
  """Parameters as given alongside `model_config` -> one entry per member, as a tuple."""
  if isinstance(model_config, TransformerConfig):
    return lambda params: (params,)
  return tuple


def _check_members(configs, members_params) -> None:
  if len(members_params) != len(configs):  # zip would drop members silently.
    raise ValueError(f"{len(configs)} model configs but {len(members_params)} parameter sets")


def make_search_fn(model_config: Members, search: SearchConfig, *,
                   memory: tuple[int, str] | None = None
                   ) -> Callable[..., search_lib.SearchResult]:
  """(params, inputs int [B, S], rng[, prefix int [B, P]]) -> SearchResult; jit it.

  Given a sequence of configs (an ensemble), params is the matching sequence and
  each step's distribution is the mean of the members' probabilities. prefix
  (P >= 1): each row's forced target prefix, 0-padded, no EOS; its lengths are
  data, so one program serves every prefix up to P tokens. memory: check_search's bound
  where not the device's (an export's, search_memory.export_bound).
  """
  configs = member_configs(model_config)
  search.check_vocabulary(configs[0].vocab_size)
  as_members = as_members_of(model_config)
  encoders = [Transformer(c.replace(deterministic=True, decode=False)) for c in configs]
  decoders = [Transformer(c.replace(deterministic=True, decode=True)) for c in configs]
  max_len = min(c.max_len for c in configs)
  extra = min(search.max_extra, max_len)  # An int32 sum below: 10**12 would overflow.

  def search_fn(params, inputs, rng, prefix=None):
    batch, source_len = inputs.shape
    # Before anything is traced or compiled (`inputs`: this device's rows under shard_map).
    search_memory.check_search(configs, search, rows=batch, width=source_len, memory=memory,
                               prefix_width=None if prefix is None else prefix.shape[1])
    forced = {}
    max_decode_len = search_memory.decode_length(
        extra, max_len, source_len, None if prefix is None else prefix.shape[1])
    if prefix is not None:
      forced = dict(forced_ids=prefix,
                    forced_lengths=(prefix != PAD_ID).sum(axis=1).astype(jnp.int32))
    source_lengths = (inputs != 0).sum(axis=1)
    # A filler row (all padding, completing a batch's compiled shape) ends at once:
    # left open, it would babble to max_extra tokens and hold its batch's loop open.
    max_lengths = jnp.where(source_lengths > 0,
                            jnp.minimum(source_lengths + extra, max_decode_len), 1)
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
  configs = member_configs(model_config)
  as_members = as_members_of(model_config)
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
  log_probs = [jax.nn.log_softmax(x.astype(jnp.promote_types(x.dtype, search_lib.score_dtype())))
               for x in logits]  # The search's scores' dtype (float64 under x64).
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
