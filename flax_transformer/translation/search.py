"""Model-agnostic autoregressive search: beam search, greedy and sampling.

A model enters only through `tokens_to_logits(ids [N, 1], cache) -> (logits
[N, V], cache)`, where N is batch x beams and every cache leaf with a leading
dimension N is a per-sequence state (reordered when beams are). Token 0 (pad)
is never generated; `eos_id` ends a sequence. Forced tokens (`forced_ids` [B, P]
with `forced_lengths` [B]) make each sequence start with its own given prefix:
one compiled program serves prefixes of every length up to P.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

TokensToLogits = Callable[[jax.Array, Any], tuple[jax.Array, Any]]
NEG_INF = -1.0e7  # Finite, so sums of it stay ordered and never NaN.
PAD_ID = 0


def score_dtype() -> jnp.dtype:
  """Scores' dtype: jax's default float (float32; float64 under jax_enable_x64)."""
  return jnp.result_type(float)


def _log_softmax(logits: jax.Array) -> jax.Array:
  """Log-probabilities in the scores' dtype or wider (bfloat16 logits: float32)."""
  return jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, score_dtype())))


def _div(x: jax.Array, n: int) -> jax.Array:
  """x // n for x >= 0 (lax's div: no sign fix-up), n in x's integer dtype."""
  return jax.lax.div(x, jnp.asarray(n, x.dtype))


def _rem(x: jax.Array, n: int) -> jax.Array:
  """x % n for x >= 0 (lax's rem: no sign fix-up), n in x's integer dtype."""
  return jax.lax.rem(x, jnp.asarray(n, x.dtype))


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha."""
  return ((5.0 + length.astype(score_dtype())) / 6.0) ** alpha


def repeat_beams(x: jax.Array, beam_size: int) -> jax.Array:
  """[B, ...] -> [B * beam_size, ...], each row repeated beam_size times."""
  return jnp.repeat(x, beam_size, axis=0)


def _gather_beams(tree, indices: jax.Array, batch_size: int, beam_size: int):
  """Reorders [B*K_old, ...] (or [B, K_old, ...]) leaves by beam indices [B, K_new]."""
  flat_rows = (jnp.arange(batch_size)[:, None] * beam_size + indices).reshape(-1)

  def gather(x):
    if x.ndim == 0 or x.shape[0] != batch_size * beam_size:
      return x  # Shared state (cache indices, step counters).
    return x[flat_rows]
  return jax.tree_util.tree_map(gather, tree)


def _forbid(log_probs: jax.Array, step: jax.Array, max_lengths: jax.Array,
            eos_id: int) -> jax.Array:
  """Never pad; only EOS at a sequence's last allowed position. log_probs [B, K, V]."""
  vocab = jnp.arange(log_probs.shape[-1])
  log_probs = jnp.where(vocab == PAD_ID, NEG_INF, log_probs)
  at_limit = (step + 1 >= max_lengths)[:, None, None]
  return jnp.where(at_limit & (vocab != eos_id), NEG_INF, log_probs)


def _forced_token(forced_ids: jax.Array, step: jax.Array) -> jax.Array:
  """int [B]: each sequence's forced token at `step` (meaningful while step < its length)."""
  return jax.lax.dynamic_index_in_dim(forced_ids, jnp.minimum(step, forced_ids.shape[1] - 1), 1,
                                      False)


def _force(log_probs: jax.Array, step: jax.Array, forced_ids: jax.Array | None,
           forced_lengths: jax.Array | None) -> jax.Array:
  """While step < forced_lengths, only the forced token: log_probs [B, K, V].

  The forced token keeps its own log-prob (every other token gets NEG_INF), so a
  hypothesis' score is the model's log P of all its tokens, forced ones included:
  comparable with unforced searches and with teacher-forced scoring.
  """
  if forced_ids is None:
    return log_probs
  token = _forced_token(forced_ids, step)[:, None, None]
  forcing = (step < forced_lengths)[:, None, None]
  vocab = jnp.arange(log_probs.shape[-1])
  return jnp.where(forcing & (vocab != token), NEG_INF, log_probs)


def _max_lengths(max_lengths, batch_size, length, forced_lengths) -> jax.Array:
  """int [B]: each sequence's longest output, EOS included, room for its forced tokens."""
  if max_lengths is None:
    max_lengths = jnp.full((batch_size,), length, jnp.int32)
  if forced_lengths is not None:
    max_lengths = jnp.maximum(max_lengths, forced_lengths + 1)
  return jnp.minimum(max_lengths, length)


class BeamState(NamedTuple):
  """The search's state: each step writes one column of its history in place, and
  finished hypotheses are pointers into it (sequences are built once, at the end)."""

  step: jax.Array  # int32 [], tokens generated so far.
  choices: jax.Array  # int32 [L, B, K]: [t, b, k] = token * K + p: live beam k of step t
  # extends live beam p of step t - 1 by `token`.
  alive_log_probs: jax.Array  # score_dtype() [B, K]
  finished_ends: jax.Array  # int32 [B, K]: t * K + p, EOS at step t after live beam p of
  # step t - 1 (p = 0 at t = 0); -1: no hypothesis (an all-pad sequence).
  finished_scores: jax.Array  # score_dtype() [B, K], length-penalised; NEG_INF if none.
  cache: Any


class SearchResult(NamedTuple):
  sequences: jax.Array  # int32 [B, K, L], best first, EOS-terminated, 0-padded.
  scores: jax.Array  # score_dtype() [B, K]: log P / lp (beam) or log P (greedy/sampling).


def _initial_beam_state(cache, b: int, k: int, length: int) -> BeamState:
  """No tokens yet; only beam 0 of each sentence live, so the K beams do not start as
  copies; no finished hypotheses."""
  return BeamState(
      step=jnp.array(0, jnp.int32),
      choices=jnp.zeros((length, b, k), jnp.int32),
      alive_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), score_dtype()), (b, 1)),
      finished_ends=jnp.full((b, k), -1, jnp.int32),
      finished_scores=jnp.full((b, k), NEG_INF, score_dtype()),
      cache=cache)


def _backtrack(choices: jax.Array, ends: jax.Array, eos_id: int) -> jax.Array:
  """Finished hypotheses' sequences int32 [B, K, L] from the history [L, B, K] and their
  pointers `ends` [B, K] (`BeamState`'s choices and finished_ends): EOS-terminated,
  0-padded."""
  length, _, k = choices.shape
  end = ends // k  # EOS position (-1: none, as floor division keeps it).

  def back(i, carry):  # Position t = L - 1 - i: the token of `beam`, then its parent.
    sequences, beam = carry
    t = length - 1 - i
    before_end = t < end
    choice = jnp.take_along_axis(choices[t], beam, axis=1)
    token = jnp.where(before_end, _div(choice, k), jnp.where(t == end, eos_id, 0))
    return sequences.at[t].set(token), jnp.where(before_end, _rem(choice, k), beam)

  sequences, _ = jax.lax.fori_loop(0, length, back,
                                   (jnp.zeros_like(choices), ends % k))
  return sequences.transpose(1, 2, 0)


def _previous_token(s: BeamState, k: int) -> jax.Array:
  """int [B, K]: each live beam's last token (its history's column; pad, 0, at step 0)."""
  return jnp.where(s.step > 0, _div(s.choices[jnp.maximum(s.step - 1, 0)], k), 0)


def _keep_finished(s: BeamState, top_log_probs: jax.Array, top_beams: jax.Array,
                   may_end: jax.Array, k: int, alpha: float, eos_within_beam: bool):
  """(ends, scores) of the best K finished hypotheses: those kept so far and the step's
  candidates that just ended (with eos_within_beam, only those among its K best)."""
  new_scores = top_log_probs / length_penalty(s.step + 1, alpha)
  if eos_within_beam:
    may_end = may_end & (jnp.arange(top_log_probs.shape[1]) < k)
  new_scores = jnp.where(may_end, new_scores, NEG_INF)
  pool_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)
  pool_ends = jnp.concatenate([s.finished_ends, s.step * k + top_beams], axis=1)
  finished_scores, finished_pick = jax.lax.top_k(pool_scores, k)
  return jnp.take_along_axis(pool_ends, finished_pick, axis=1), finished_scores


def beam_search(tokens_to_logits: TokensToLogits, cache, *, batch_size: int, beam_size: int,
                max_decode_len: int, alpha: float = 0.6, eos_id: int = 1,
                max_lengths: jax.Array | None = None, forced_ids: jax.Array | None = None,
                forced_lengths: jax.Array | None = None,
                eos_within_beam: bool = False) -> SearchResult:
  """Beam search maximising log P(Y) / lp(Y) (paper section 6.1).

  cache: the model's state for batch_size * beam_size rows (beams of a
  sentence adjacent, see `repeat_beams`). max_lengths: int [B] longest output
  per sentence, EOS included (default max_decode_len). forced_ids int [B, P],
  forced_lengths int [B]: every hypothesis of sentence b starts with
  forced_ids[b, :forced_lengths[b]] (no EOS; None: no prefixes). Stops when no
  live beam can still beat the K-th best finished hypothesis of every sentence.
  eos_within_beam: a hypothesis may end only as one of a step's K best candidates, as
  in transformers' generate and fairseq (default: as any of the 2K the step considers).
  """
  b, k, length = batch_size, beam_size, max_decode_len
  max_lengths = _max_lengths(max_lengths, b, length, forced_lengths)
  state = _initial_beam_state(cache, b, k, length)

  def not_done(s: BeamState) -> jax.Array:
    # The best a live beam can reach: its log-prob now, penalised at its longest.
    best_alive = s.alive_log_probs[:, 0] / length_penalty(max_lengths, alpha)
    worst_finished = s.finished_scores[:, -1]
    open_sentence = (best_alive > worst_finished) & (s.alive_log_probs[:, 0] > NEG_INF / 2)
    return (s.step < length) & jnp.any(open_sentence)

  def step_fn(s: BeamState) -> BeamState:
    logits, cache = tokens_to_logits(_previous_token(s, k).reshape(b * k, 1), s.cache)
    log_probs = _log_softmax(logits).reshape(b, k, -1)
    log_probs = _forbid(log_probs, s.step, max_lengths, eos_id)
    log_probs = _force(log_probs, s.step, forced_ids, forced_lengths)
    vocab = log_probs.shape[-1]
    candidates = (s.alive_log_probs[:, :, None] + log_probs).reshape(b, k * vocab)
    # 2K candidates: even if K of them end in EOS, K remain to stay alive.
    top_log_probs, top_ids = jax.lax.top_k(candidates, min(2 * k, k * vocab))
    top_beams, top_tokens = _div(top_ids, vocab), _rem(top_ids, vocab)
    ended = top_tokens == eos_id
    dead = top_log_probs <= NEG_INF / 2

    # Live beams: the best K candidates that did not just end. One index each (parent
    # and token) reorders the cache and fills one column of the history in place.
    alive_scores = jnp.where(ended | dead, 2 * NEG_INF, top_log_probs)
    alive_log_probs, alive_pick = jax.lax.top_k(alive_scores, k)
    choice = jnp.take_along_axis(top_tokens * k + top_beams, alive_pick, axis=1)
    choices = jax.lax.dynamic_update_index_in_dim(s.choices, choice, s.step, 0)
    cache = _gather_beams(cache, _rem(choice, k), b, k)

    finished_ends, finished_scores = _keep_finished(
        s, top_log_probs, top_beams, ended & ~dead, k, alpha, eos_within_beam)
    return BeamState(s.step + 1, choices, alive_log_probs, finished_ends, finished_scores,
                     cache)

  final = jax.lax.while_loop(not_done, step_fn, state)
  return SearchResult(_backtrack(final.choices, final.finished_ends, eos_id),
                      final.finished_scores)


class SampleState(NamedTuple):
  step: jax.Array
  seqs: jax.Array  # int32 [B, L]
  log_probs: jax.Array  # score_dtype() [B]
  done: jax.Array  # bool [B]
  cache: Any
  rng: jax.Array


def sample_search(tokens_to_logits: TokensToLogits, cache, *, batch_size: int,
                  max_decode_len: int, eos_id: int = 1, temperature: float = 0.0,
                  top_k: int = 0, top_p: float = 1.0, rng: jax.Array | None = None,
                  max_lengths: jax.Array | None = None, forced_ids: jax.Array | None = None,
                  forced_lengths: jax.Array | None = None) -> SearchResult:
  """One sequence per row: greedy (temperature 0) or sampled with temperature/top-k/top-p.

  Scores are the sequences' log-probabilities under the (temperature-free) model,
  forced tokens (as `beam_search` takes them) included.
  """
  b, length = batch_size, max_decode_len
  max_lengths = _max_lengths(max_lengths, b, length, forced_lengths)
  if temperature > 0 and rng is None:
    raise ValueError("sampling (temperature > 0) needs an rng")
  state = SampleState(jnp.array(0, jnp.int32), jnp.zeros((b, length), jnp.int32),
                      jnp.zeros((b,), score_dtype()), jnp.zeros((b,), bool), cache,
                      rng if rng is not None else jax.random.PRNGKey(0))

  def not_done(s: SampleState):
    return (s.step < length) & ~jnp.all(s.done)

  def step_fn(s: SampleState) -> SampleState:
    previous = jnp.where(s.step > 0, jax.lax.dynamic_index_in_dim(s.seqs, s.step - 1, 1, False),
                         0)
    logits, cache = tokens_to_logits(previous.reshape(b, 1), s.cache)
    log_probs = _log_softmax(logits)
    log_probs = _forbid(log_probs[:, None, :], s.step, max_lengths, eos_id)
    log_probs = _force(log_probs, s.step, forced_ids, forced_lengths)[:, 0]
    rng, key = jax.random.split(s.rng)
    if temperature > 0:
      token = jax.random.categorical(key, _truncate(log_probs / temperature, top_k, top_p))
    else:
      token = jnp.argmax(log_probs, axis=-1)
    if forced_ids is not None:  # A high temperature could otherwise draw a NEG_INF token.
      token = jnp.where(s.step < forced_lengths, _forced_token(forced_ids, s.step), token)
    token = jnp.where(s.done, PAD_ID, token).astype(jnp.int32)
    chosen = jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0]
    seqs = jax.lax.dynamic_update_index_in_dim(s.seqs, token, s.step, axis=1)
    return SampleState(s.step + 1, seqs, s.log_probs + jnp.where(s.done, 0.0, chosen),
                       s.done | (token == eos_id), cache, rng)

  final = jax.lax.while_loop(not_done, step_fn, state)
  return SearchResult(final.seqs[:, None, :], final.log_probs[:, None])


def _truncate(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Keeps the top_k most likely tokens and the smallest set with mass >= top_p."""
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    mass_before = jnp.cumsum(jax.nn.softmax(sorted_logits), axis=-1) - jax.nn.softmax(
        sorted_logits)
    kept = jnp.where(mass_before < top_p, sorted_logits, jnp.inf)
    threshold = jnp.min(kept, axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, NEG_INF, logits)
  return logits
