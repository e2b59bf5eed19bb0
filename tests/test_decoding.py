"""Beam search against exhaustive search, greedy, caching, batching; the decode CLI."""

import dataclasses
import functools
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flax_transformer import Transformer, TransformerConfig, averaging, compilation, init_cache
from flax_transformer.data.tokenizer import trim
from flax_transformer.translation import search as decoding
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.programs import make_search_fn
from flax_transformer.translation.translator import Translator

import conftest
from conftest import TRAINED_TINY_CHECKPOINTS, compile_threads_busy
from tools.hlo import while_loop_body


ROOT = Path(__file__).resolve().parents[1]
EOS = 1


def random_model(vocab_size, seed=0):
  cfg = TransformerConfig(vocab_size=vocab_size, d_model=16, d_ff=32, num_heads=2,
                          num_layers=1, max_len=16, deterministic=True)
  src = jnp.array([[2, 3, 4, EOS]], jnp.int32)
  params = Transformer(cfg).init(jax.random.PRNGKey(seed), src, src)["params"]
  # Random weights give near-uniform outputs; sharpen them so the search matters.
  params = jax.tree_util.tree_map(lambda x: x * 3.0, params)
  return cfg, params


def cached_tokens_to_logits(cfg, params, inputs, beams, length):
  """(tokens_to_logits, its cache) of the incremental decoder, `beams` rows per sentence."""
  model = Transformer(cfg)
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
  cache = init_cache(cfg, params, encoded, length, beams)
  if not cfg.share_beam_cache:
    encoded, inputs = decoding.repeat_beams(encoded, beams), decoding.repeat_beams(inputs, beams)
  decoder = Transformer(cfg.replace(decode=True))

  def tokens_to_logits(ids, cache):
    logits, updated = decoder.apply({"params": params, "cache": cache}, encoded, inputs, ids,
                                    method=Transformer.decode, mutable=["cache"])
    return logits[:, 0], updated["cache"]
  return tokens_to_logits, cache


def uncached_tokens_to_logits(cfg, params, inputs, beams, length):
  """Re-runs the whole decoder on the prefix at every step; the 'cache' is the prefix."""
  model = Transformer(cfg)
  inputs = decoding.repeat_beams(inputs, beams)

  def tokens_to_logits(ids, cache):
    prefix, step = cache["prefix"], cache["step"]
    # prefix holds tokens fed so far; targets shifted right inside the model.
    prefix = jax.lax.dynamic_update_index_in_dim(prefix, ids[:, 0], step, axis=1)
    targets = jnp.concatenate([prefix[:, 1:], jnp.ones_like(prefix[:, :1])], axis=1)
    # Positions from `step` on are not known yet: any non-pad id (causality hides them).
    targets = jnp.where(jnp.arange(length) >= step, 1, targets)
    logits = model.apply({"params": params}, inputs, targets)
    return logits[:, step], {"prefix": prefix, "step": step + 1}
  cache = {"prefix": jnp.zeros((inputs.shape[0], length), jnp.int32),
           "step": jnp.array(0, jnp.int32)}
  return tokens_to_logits, cache


@functools.partial(jax.jit, static_argnums=0)
def full_logits(cfg, params, inputs, targets):
  """The whole model's teacher-forced logits, jitted: one compile per shape, where
  running it op by op compiles every operation of the first call on its own."""
  return Transformer(cfg).apply({"params": params}, inputs, targets)


def sequence_log_prob(cfg, params, inputs, tokens):
  logits = full_logits(cfg, params, inputs, jnp.array([tokens], jnp.int32))
  log_probs = np.asarray(jax.nn.log_softmax(logits[0]))
  return float(sum(log_probs[t, tok] for t, tok in enumerate(tokens)))


def exhaustive_search(log_prob, vocab, max_length, alpha):
  """Every output beam search may return, [(log P / lp, tokens)] best first: n content
  tokens (2..vocab-1) then EOS, n < max_length (EOS is forced at the last position).
  log_prob(tokens) -> float."""
  scored = []
  for n in range(max_length):
    for body in itertools.product(range(2, vocab), repeat=n):
      tokens = list(body) + [EOS]
      scored.append((log_prob(tokens) / ((5 + len(tokens)) / 6) ** alpha, tokens))
  return sorted(scored, key=lambda x: -x[0])


def nbest(result, row):
  """[(score, tokens with EOS)] of one sentence of a SearchResult, best first, without
  the empty slots (NEG_INF)."""
  return [(float(s), trim(seq) + [EOS])
          for s, seq in zip(result.scores[row], result.sequences[row]) if s > -1e6]


def test_beam_equals_exhaustive_search():
  vocab, length, alpha = 5, 3, 0.6
  cfg, params = random_model(vocab)
  inputs = jnp.array([[2, 3, 4, 3, EOS]], jnp.int32)
  beams = (vocab - 1) ** length  # Every non-pad sequence fits in the beam.
  result = jax.jit(lambda: decoding.beam_search(
      *cached_tokens_to_logits(cfg, params, inputs, beams, length),
      batch_size=1, beam_size=beams, max_decode_len=length, alpha=alpha, eos_id=EOS))()
  scored = exhaustive_search(lambda tokens: sequence_log_prob(cfg, params, inputs, tokens),
                             vocab, length, alpha)
  found = nbest(result, 0)
  assert len(found) == len(scored) == 13
  assert [t for _, t in found] == [t for _, t in scored]
  np.testing.assert_allclose([s for s, _ in found], [s for s, _ in scored], atol=1e-4)


# --- Beam search on random logits tables, against exhaustive search ---------------

TABLE_VOCAB, TABLE_LENGTH, TABLE_SENTENCES = 4, 6, 2  # Pad, EOS, 2 content tokens.
EXACT_BEAM = (TABLE_VOCAB - 2) ** (TABLE_LENGTH - 1)  # Every live prefix fits: exact.
SMALL_BEAM = 2  # Fills its n-best early: the early stop has work to do.
_while_loop = jax.lax.while_loop


def prefix_code(prefix, vocab=TABLE_VOCAB):
  """A prefix of non-pad ids as a base-`vocab` number: one row of the table per prefix."""
  code = 0
  for token in prefix:
    code = code * vocab + token
  return code


def to_max_length(cond, body, state):
  """jax.lax.while_loop for beam_search without its early stop: every step is run."""
  return _while_loop(lambda s: s.step < TABLE_LENGTH, body, state)


@functools.partial(jax.jit, static_argnames=("beams", "early_stop"))
def table_search(table, max_lengths, alpha, beams, early_stop=True):
  """beam_search whose model reads the logits [V] after each prefix from table
  [sentences, V ** (L - 1), V]; the per-row cache is the prefix's code. Without
  early_stop, traced running every step up to L."""
  sentences, _, vocab = table.shape

  def tokens_to_logits(ids, code):
    code = code * vocab + ids[:, 0]  # Step 0 feeds pad (0): the empty prefix is row 0.
    return table[jnp.arange(sentences * beams) // beams, code], code

  def search():
    return decoding.beam_search(
        tokens_to_logits, jnp.zeros(sentences * beams, jnp.int32), batch_size=sentences,
        beam_size=beams, max_decode_len=TABLE_LENGTH, alpha=alpha, eos_id=EOS,
        max_lengths=max_lengths)
  if early_stop:
    return search()
  with mock.patch.object(jax.lax, "while_loop", to_max_length):
    return search()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), sharpness=st.sampled_from([0.5, 2.0, 6.0]),
       alpha=st.floats(0.0, 3.0),
       max_lengths=st.lists(st.integers(1, TABLE_LENGTH), min_size=TABLE_SENTENCES,
                            max_size=TABLE_SENTENCES))
# Random tables seldom punish an early stop that bounds live beams at their current
# length instead of their longest (under 1 in 100 draws): two that do, found by search.
@example(seed=21, sharpness=6.0, alpha=2.0, max_lengths=[TABLE_LENGTH] * 2)
@example(seed=37, sharpness=6.0, alpha=1.0, max_lengths=[TABLE_LENGTH] * 2)
def test_beam_search_on_random_tables_is_exhaustive_search(seed, sharpness, alpha, max_lengths):
  """Tiny vocabulary, random logits after every prefix: the exact beam's n-best are the
  best of every sequence in order, scored log P / lp; a small beam's are in order and
  scored right, and the same as when it runs every step instead of stopping early."""
  shape = (TABLE_SENTENCES, TABLE_VOCAB ** (TABLE_LENGTH - 1), TABLE_VOCAB)
  table = np.random.default_rng(seed).normal(0.0, sharpness, shape).astype(np.float32)
  top = table.max(-1, keepdims=True).astype(np.float64)
  log_probs = table - top - np.log(np.exp(table - top).sum(-1, keepdims=True))
  args = (jnp.asarray(table), jnp.asarray(max_lengths, jnp.int32), jnp.float32(alpha))
  exact = table_search(*args, beams=EXACT_BEAM)
  early = table_search(*args, beams=SMALL_BEAM)
  full = table_search(*args, beams=SMALL_BEAM, early_stop=False)
  for row, max_length in enumerate(max_lengths):
    def log_prob(tokens, row=row):
      return sum(float(log_probs[row, prefix_code(tokens[:i]), t]) for i, t in enumerate(tokens))
    expected = exhaustive_search(log_prob, TABLE_VOCAB, max_length, alpha)
    for found, beams in ((nbest(exact, row), EXACT_BEAM), (nbest(early, row), SMALL_BEAM)):
      # The search's score of each sequence it returns, and no sequence twice.
      np.testing.assert_allclose([s for s, _ in found], [log_prob(t) / ((5 + len(t)) / 6) ** alpha
                                                         for _, t in found], rtol=1e-5, atol=1e-5)
      assert len({tuple(t) for _, t in found}) == len(found)
      assert all(len(t) <= max_length for _, t in found)
      if beams == EXACT_BEAM:  # The top n of all, in order (ties aside: compared by score).
        assert len(found) == min(beams, len(expected))
        np.testing.assert_allclose([s for s, _ in found], [s for s, _ in expected[:beams]],
                                   rtol=1e-5, atol=1e-5)
      else:  # In order.
        assert all(a >= b for (a, _), (b, _) in zip(found, found[1:]))
    assert nbest(early, row) == nbest(full, row)


def test_beam_search_n_best_slots_without_a_hypothesis_are_padding():
  """Fewer sequences than beams (max lengths 1 and 2: 1 and 3 sequences): the n-best
  slots left over hold pad tokens only and score NEG_INF, the others their sequence once
  (built from the search's history, which live beams share)."""
  table = np.random.default_rng(5).normal(0.0, 2.0, (TABLE_SENTENCES, TABLE_VOCAB ** (
      TABLE_LENGTH - 1), TABLE_VOCAB)).astype(np.float32)
  result = table_search(jnp.asarray(table), jnp.asarray([1, 2], jnp.int32), jnp.float32(0.6),
                        beams=EXACT_BEAM)
  sequences, scores = np.asarray(result.sequences), np.asarray(result.scores)
  for row, expected in enumerate(({(EOS,)}, {(EOS,), (2, EOS), (3, EOS)})):
    count = len(expected)
    assert (scores[row, :count] > -1e6).all()
    found = [list(seq) for seq in sequences[row, :count]]
    assert {tuple(seq[:seq.index(EOS) + 1]) for seq in found} == expected
    assert all(not any(seq[seq.index(EOS) + 1:]) for seq in found)
    np.testing.assert_array_equal(sequences[row, count:], 0)
    np.testing.assert_array_equal(scores[row, count:], decoding.NEG_INF)


def test_beam_one_equals_greedy():
  cfg, params = random_model(12, seed=1)
  inputs = jnp.array([[2, 5, 7, 9, EOS], [3, 4, EOS, 0, 0]], jnp.int32)
  length = 10
  beam = decoding.beam_search(*cached_tokens_to_logits(cfg, params, inputs, 1, length),
                              batch_size=2, beam_size=1,
                              max_decode_len=length, alpha=0.0, eos_id=EOS)
  greedy = decoding.sample_search(*cached_tokens_to_logits(cfg, params, inputs, 1, length),
                                  batch_size=2,
                                  max_decode_len=length, eos_id=EOS)
  np.testing.assert_array_equal(beam.sequences[:, 0], greedy.sequences[:, 0])
  np.testing.assert_allclose(beam.scores[:, 0], greedy.scores[:, 0], atol=1e-5)
  top1 = decoding.sample_search(*cached_tokens_to_logits(cfg, params, inputs, 1, length),
                                batch_size=2, max_decode_len=length,
                                eos_id=EOS, temperature=0.7, top_k=1, rng=jax.random.PRNGKey(3))
  np.testing.assert_array_equal(top1.sequences, greedy.sequences)


@pytest.mark.parametrize("share_beam_cache", [True, False])
def test_cached_equals_uncached_decoding(share_beam_cache):
  cfg, params = random_model(12, seed=2)
  cfg = cfg.replace(share_beam_cache=share_beam_cache)
  inputs = jnp.array([[2, 5, 7, 9, EOS], [3, 4, EOS, 0, 0]], jnp.int32)
  length, beams = 8, 3
  cached = decoding.beam_search(*cached_tokens_to_logits(cfg, params, inputs, beams, length),
                                batch_size=2,
                                beam_size=beams, max_decode_len=length, eos_id=EOS)
  fn, cache = uncached_tokens_to_logits(cfg, params, inputs, beams, length)
  uncached = decoding.beam_search(fn, cache, batch_size=2, beam_size=beams,
                                  max_decode_len=length, eos_id=EOS)
  np.testing.assert_array_equal(cached.sequences, uncached.sequences)
  np.testing.assert_allclose(cached.scores, uncached.scores, atol=1e-4)


def test_search_loop_reads_invariants_in_place():
  """The compiled search loop neither branches to fill the encoder-decoder keys/values
  (`init_cache` fills them before it) nor transposes an output kernel [N, d_v, D] at
  every step (it reads the cache's view): nothing in its body takes such a kernel."""
  cfg = TransformerConfig(vocab_size=20, d_model=24, d_ff=32, num_heads=2, num_layers=2,
                          max_len=16, deterministic=True)
  inputs = jnp.array([[2, 5, 7, 9, EOS], [3, 4, EOS, 0, 0]], jnp.int32)
  params = Transformer(cfg).init(jax.random.PRNGKey(0), inputs, inputs)["params"]
  search_fn = jax.jit(make_search_fn(cfg, SearchConfig(beam_size=3, max_extra=6)))
  body = while_loop_body(search_fn.lower(params, inputs, jax.random.PRNGKey(0)).compile().as_text())
  assert any("Transformer.decode" in line for line in body)  # The decoder's step is in there.
  assert not [line for line in body if " conditional(" in line]
  # An output kernel, [N, d_v, D].
  kernel = rf"= f32\[{cfg.num_heads},{cfg.d_model // cfg.num_heads},{cfg.d_model}\]\{{"
  kernels = {line.split(" ")[0] for line in body if re.search(kernel, line)}
  readers = [line for line in body
             if any(re.search(re.escape(k) + r"[,)]", line.split("=", 1)[1]) for k in kernels)]
  assert not readers, readers


@pytest.mark.devices(8)
def test_tensor_parallel_search_gathers_no_output_kernel():
  """Under tensor parallelism (training's BLEU decodes on the training mesh) the
  cached output-kernel views keep the heads' mesh axis: the search loop gathers no
  kernel per attention (a view merged to [d_v * N, D] was replicated, and every step
  gathered each attention's output to multiply it whole)."""
  from configs import tiny

  from flax_transformer.training import sharding as sharding_lib
  from flax_transformer.training.steps import Trainer

  cfg = TransformerConfig(vocab_size=64, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                          max_len=32, deterministic=True)
  mesh = sharding_lib.make_mesh({"data": 4, "tensor": 2})
  params = Trainer(cfg, tiny.get_config(), mesh).abstract_state.params  # Sharded, abstract.
  search_fn = jax.jit(make_search_fn(cfg, SearchConfig(beam_size=2, max_extra=4)),
                      out_shardings=sharding_lib.replicated(mesh))
  with jax.set_mesh(mesh):
    hlo = search_fn.lower(params, jax.ShapeDtypeStruct((8, 8), jnp.int32),
                          jax.random.PRNGKey(0)).compile().as_text()
  gathers = [line for line in while_loop_body(hlo) if re.search(r" all-gather(-start)?\(", line)]
  assert len(gathers) < 2 * cfg.decoder_layers, gathers  # Fewer than one per attention.


def test_batched_equals_alone():
  cfg, params = random_model(20, seed=3)
  search_fn = jax.jit(make_search_fn(cfg, SearchConfig(beam_size=3, max_extra=6)))
  rng = np.random.default_rng(0)
  sources = [rng.integers(2, 20, size=n) for n in (3, 7, 5, 2)]
  width = 8
  batch = np.zeros((5, width), np.int32)  # Row 4: filler (all padding), as eval batches have.
  for i, s in enumerate(sources):
    batch[i, :len(s)] = s
    batch[i, len(s)] = EOS
  together = search_fn(params, jnp.asarray(batch), jax.random.PRNGKey(0))
  # A filler row ends at once instead of decoding up to max_extra tokens.
  assert together.sequences[4, 0, 0] == EOS and not together.sequences[4, :, 1:].any()
  greedy = jax.jit(make_search_fn(cfg, SearchConfig(beam_size=1, max_extra=6)))(
      params, jnp.asarray(batch), jax.random.PRNGKey(0))
  assert greedy.sequences[4, 0, 0] == EOS and not greedy.sequences[4, 0, 1:].any()
  for i in range(4):
    alone = search_fn(params, jnp.asarray(batch[i:i + 1]), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(alone.sequences[0], together.sequences[i])
    np.testing.assert_allclose(alone.scores[0], together.scores[i], atol=1e-5)
  # Output length respects source length + max_extra (EOS included).
  for i, s in enumerate(sources):
    assert len(trim(together.sequences[i, 0])) + 1 <= len(s) + 1 + 6


def test_ensemble_greedy_equals_mean_of_full_model_probabilities():
  """Each step of an ensemble picks the argmax of the members' mean probability."""
  (cfg, params_a), (_, params_b) = random_model(20, seed=5), random_model(20, seed=6)
  # Members may lay out their caches differently.
  configs = [cfg, cfg.replace(share_beam_cache=False)]
  max_extra = 5
  search_fn = jax.jit(make_search_fn(configs, SearchConfig(beam_size=1, max_extra=max_extra)))
  inputs = np.array([[2, 5, 7, 9, EOS], [3, 4, EOS, 0, 0]], np.int32)
  out = search_fn((params_a, params_b), jnp.asarray(inputs), jax.random.PRNGKey(0))
  for row in range(2):
    limit = min(int((inputs[row] != 0).sum()) + max_extra, inputs.shape[1] + max_extra)
    tokens, total = [], 0.0
    while not tokens or tokens[-1] != EOS:
      # The whole decoder over the prefix; positions not generated yet are masked by causality.
      targets = jnp.array([tokens + [EOS] * (limit - len(tokens))], jnp.int32)
      probs = np.mean([np.asarray(jax.nn.softmax(
          full_logits(cfg, p, jnp.asarray(inputs[row:row + 1]), targets)[0, len(tokens)]))
          for p in (params_a, params_b)], axis=0)
      probs[0] = 0.0  # Never pad.
      token = EOS if len(tokens) + 1 >= limit else int(np.argmax(probs))
      tokens.append(token)
      total += float(np.log(probs[token]))
    assert trim(out.sequences[row, 0]) + [EOS] == tokens
    np.testing.assert_allclose(out.scores[row, 0], total, rtol=1e-4, atol=1e-4)


def test_ensemble_of_one_model_twice_equals_the_model():
  cfg, params = random_model(20, seed=7)
  search = SearchConfig(beam_size=3, max_extra=6)
  inputs = jnp.array([[2, 5, 7, 9, EOS], [3, 4, EOS, 0, 0]], jnp.int32)
  single = jax.jit(make_search_fn(cfg, search))(params, inputs, jax.random.PRNGKey(0))
  twice = jax.jit(make_search_fn([cfg, cfg.replace(share_beam_cache=False)], search))(
      (params, params), inputs, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(twice.sequences, single.sequences)
  np.testing.assert_allclose(twice.scores, single.scores, atol=1e-5)


# --- Translator and decode.py on a trained tiny workdir -------------------------

FIRST, LAST = TRAINED_TINY_CHECKPOINTS  # Its two checkpoints' steps.


@pytest.fixture(scope="module")
def workdir(trained_tiny):
  """The session's trained tiny run (conftest.trained_tiny): read, never written."""
  return trained_tiny


def decode(workdir, *args, stdin=b""):
  env = conftest.cpu_env()
  # The session's compilation cache, not the developer's ~/.cache; a test's own flag wins.
  return subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}",
                         "--batch_tokens=256", "--max_extra=5",
                         f"--compilation_cache_dir={conftest.XLA_CACHE}", *args], input=stdin,
                        capture_output=True, env=env)


def test_translator_api(workdir):
  translator = Translator.from_workdir(workdir,
                                       search=SearchConfig(beam_size=2, max_extra=5, nbest=2),
                                       average_last=2)
  assert translator.checkpoint_steps == ([FIRST, LAST],)
  out = translator.translate(["A dog runs.", "", "Two men talk."])
  assert len(out) == 3 and out[1] == "" and out[0]
  nbest = translator.translate_nbest(["A dog runs."])[0]
  assert len(nbest) == 2 and nbest[0][1] >= nbest[1][1]
  # Empty sentences are not searched, and have their n-best too (decode.py: K lines each).
  assert translator.translate_nbest(["", "  "]) == [[("", 0.0)] * 2] * 2


def test_translator_compiles_its_searches_while_the_checkpoints_load(workdir):
  """from_workdir(compile_for=...) asks for every search shape's compile, with abstract
  parameters, before it loads a checkpoint; the translations then run on those
  programs (no other compile) and equal a translator's that compiled at first use."""
  sentences = ["A dog runs.", "", "Two men talk about the long day they had at work."]
  events, compile_ahead, load_params = [], compilation.PerShape.compile_ahead, averaging.load_params

  def spy_compile(self, *args):
    events.append(("compile", args))
    return compile_ahead(self, *args)

  def spy_load(*args, **kwargs):
    events.append(("load", None))
    return load_params(*args, **kwargs)

  search = SearchConfig(beam_size=2, max_extra=5, nbest=2)
  with mock.patch.object(compilation.PerShape, "compile_ahead", spy_compile), \
      mock.patch.object(averaging, "load_params", spy_load):
    ahead = Translator.from_workdir(workdir, search=search, average_last=2,
                                    compile_for=sentences)
  kinds = [kind for kind, _ in events]
  assert kinds == ["compile"] * (len(kinds) - 1) + ["load"] and len(kinds) >= 2, kinds
  for _, args in events[:-1]:
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(args))
  assert ahead.translate_nbest(sentences) == Translator.from_workdir(
      workdir, search=search, average_last=2).translate_nbest(sentences)
  assert ahead._search_fn.num_shapes == len(kinds) - 1  # noqa: SLF001


def test_compile_ahead_follows_the_parameters_set(workdir):
  """Parameters set by hand (here cast to bfloat16) compile ahead as they are: the
  programs compiled ahead are the ones the translation runs (not ones for the dtypes
  a checkpoint loads as, which the call then refused)."""
  search = SearchConfig(beam_size=2, max_extra=5)
  loaded = Translator.from_workdir(workdir, search=search, devices=jax.devices()[:1])
  config, params = loaded.member(0)
  half = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
  sentences = ["A dog runs.", "Two men talk about the long day they had at work."]
  ahead, at_first_use = (Translator(config, half, loaded.tokenizer, search=search,
                                    devices=jax.devices()[:1]) for _ in range(2))
  ahead.compile_ahead(sentences)
  assert ahead.translate(sentences) == at_first_use.translate(sentences)


def test_a_failed_load_drops_its_queued_compiles_and_no_one_elses(workdir, multi30k_dir):
  """A checkpoint that does not exist: from_workdir raises at once, dropping the searches
  it queued to compile, and a translator of the same process keeps the ones it queued."""
  from flax_transformer.checkpoints import CheckpointError

  with compile_threads_busy():  # What is queued now stays queued.
    sentences = val_sentences(multi30k_dir, 40)  # Several batch shapes.
    search = SearchConfig(beam_size=2, max_extra=5)
    healthy = Translator.from_workdir(workdir, search=search, devices=jax.devices()[:1],
                                      batch_tokens=64)
    healthy.compile_ahead(sentences)
    queued = dict(healthy._search_fn._pending)
    assert len(queued) > 1
    cancel = mock.patch.object(compilation.PerShape, "cancel_pending", autospec=True,
                               side_effect=compilation.PerShape.cancel_pending)
    with cancel as cancelled, pytest.raises(CheckpointError):
      Translator.from_workdir(workdir, checkpoint_step=99_999, compile_for=sentences,
                              search=search, devices=jax.devices()[:1], batch_tokens=64)
    (failed,), _ = cancelled.call_args
    assert failed is not healthy._search_fn and failed._pending == {}
  assert not any(f.cancelled() for f in queued.values())
  at_first_use = Translator(*healthy.member(0), healthy.tokenizer, search=search,
                            devices=jax.devices()[:1], batch_tokens=64)
  assert healthy.translate(sentences) == at_first_use.translate(sentences)


def val_sentences(multi30k_dir, count):
  import gzip

  with gzip.open(Path(multi30k_dir) / "val.en.gz", "rt") as f:
    return [next(f).rstrip("\n") for _ in range(count)]


def test_translator_over_eight_devices_equals_one_device(workdir, multi30k_dir):
  sentences = val_sentences(multi30k_dir, 13)  # Not a multiple of 8: padded rows too.
  one = Translator.from_workdir(workdir,
                                search=SearchConfig(beam_size=3, max_extra=5, nbest=3),
                                devices=jax.devices()[:1])
  eight = Translator.from_workdir(workdir, search=SearchConfig(beam_size=3, max_extra=5, nbest=3))
  assert len(eight.devices) == 8
  alone, split = one.translate_nbest(sentences), eight.translate_nbest(sentences)
  assert [[text for text, _ in hyps] for hyps in split] == \
      [[text for text, _ in hyps] for hyps in alone]
  np.testing.assert_allclose([[score for _, score in hyps] for hyps in split],
                             [[score for _, score in hyps] for hyps in alone], atol=1e-4)


def test_sampling_over_devices_draws_afresh_on_each_and_repeats_with_the_seed(workdir):
  sentences = ["A dog runs on the beach."] * 16
  # One batch of 16 rows (width 16): two rows on each of the eight devices.
  make = lambda: Translator.from_workdir(workdir,
                                         search=SearchConfig(temperature=1.0, max_extra=5),
                                         seed=3, batch_tokens=256)
  first = make()
  assert len(first.devices) == 8
  samples = first.translate(sentences)
  # The same rng on every device would repeat each device's two samples on all eight.
  assert len(set(samples)) > 2
  assert make().translate(sentences) == samples


@pytest.fixture(scope="module")
def decoded_val(workdir, tmp_path_factory, multi30k_dir):
  """One decode.py launch that the CLI tests below check each their own way (a launch
  is a Python and jax start and a restore): an empty line, then 8 validation
  sentences, on one CPU device, scored against their references, attention plots of
  the first two. (folder, its in.en, completed process)."""
  import gzip

  folder = tmp_path_factory.mktemp("decoded_val")
  with gzip.open(Path(multi30k_dir) / "val.de.gz", "rt") as f:
    references = [next(f).rstrip("\n") for _ in range(8)]
  (folder / "in.en").write_text("\n".join(["", *val_sentences(multi30k_dir, 8)]) + "\n")
  (folder / "ref.de").write_text("\n".join(["", *references]) + "\n")
  result = decode(workdir, f"--input={folder / 'in.en'}", f"--output={folder / 'out.de'}",
                  f"--reference={folder / 'ref.de'}", "--nbest=1", "--cpu_devices=1",
                  f"--attention_plot={folder / 'att.png'}", "--attention_sentences=2")
  assert result.returncode == 0, result.stderr.decode()
  return folder, folder / "in.en", result


def test_decode_cli_splits_batches_over_cpu_devices(workdir, decoded_val):
  folder, inputs, one = decoded_val
  assert "Decoding on 1 cpu device(s)" in one.stderr.decode()
  three = decode(workdir, f"--input={inputs}", "--cpu_devices=3")
  assert three.returncode == 0, three.stderr.decode()
  assert "Decoding on 3 cpu device(s)" in three.stderr.decode()
  assert three.stdout.decode() == (folder / "out.de").read_text()
  assert len(three.stdout.decode().splitlines()) == 9


def test_decode_cli_fuzz_keeps_one_line_per_input(workdir):
  rng = np.random.default_rng(0)
  lines = [b"A man rides a bike.", b"", b"\xff\xfe broken utf8 \xc3", b"x " * 400,
           b"tab\tand\x0bvertical\x0cfeed\x1b[31m escape", "Mischung 混合 смесь مزيج".encode(),
           b"\r", b"   ", bytes(rng.integers(1, 256, size=60, dtype=np.uint8)).replace(b"\n", b"")]
  result = decode(workdir, stdin=b"\n".join(lines) + b"\n")
  assert result.returncode == 0, result.stderr.decode()
  out = result.stdout.decode("utf-8").split("\n")
  assert out[-1] == "" and len(out) - 1 == len(lines)
  assert out[1] == "" and out[7] == ""
  stderr = result.stderr.decode()
  assert "not valid UTF-8" in stderr and "line 3" in stderr
  assert "truncated" in stderr


def test_decode_cli_scores_with_reference(workdir, decoded_val):
  folder, inputs, result = decoded_val
  assert len((folder / "out.de").read_text().splitlines()) == 9
  stderr = result.stderr.decode()
  assert "BLEU = " in stderr and "nrefs:1|case:mixed" in stderr and "CHRF = " in stderr
  # Lowercased BLEU too (how Multi30k papers report it), sacreBLEU's with its signature.
  from sacrebleu.metrics import BLEU

  hyps, refs = ((folder / name).read_text().splitlines() for name in ("out.de", "ref.de"))
  lowercased = BLEU(lowercase=True).corpus_score(hyps, [refs]).score
  printed = re.search(r"^BLEU lowercased = ([\d.]+) .*case:lc", stderr, re.M)
  assert printed and float(printed[1]) == round(lowercased, 2), stderr[-2000:]
  bad = decode(workdir, f"--input={inputs}", f"--reference={inputs}x")
  assert bad.returncode == 2 and b"does not exist" in bad.stderr


def test_decode_cli_attention_plots_of_several_sentences(workdir, decoded_val):
  from flax_transformer.translation.attention_plot import attention_maps

  folder, inputs, _ = decoded_val
  # Line 1 is empty, so the first two sentences are input lines 2 and 3.
  written = sorted(p.name for p in folder.glob("att*.png"))
  assert written == ["att_2.png", "att_3.png"]
  for name in written:
    assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # The plotted weights are distributions over the source tokens.
  translator = Translator.from_workdir(workdir, search=SearchConfig(beam_size=2, max_extra=5))
  sentence = inputs.read_text().splitlines()[2]
  source = translator.tokenizer.tokenize(sentence)
  target = translator.tokenizer.tokenize(translator.translate([sentence])[0])
  self_attn, cross_attn = attention_maps(*translator.member(0), source, target)
  heads = translator.model_config.num_heads
  assert self_attn.shape == (heads, len(source), len(source))
  assert cross_attn.shape == (heads, len(target), len(source))
  np.testing.assert_allclose(self_attn.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(cross_attn.sum(-1), 1.0, atol=1e-5)
  bad = decode(workdir, f"--input={inputs}", f"--attention_plot={folder / 'bad.png'}",
               "--attention_sentences=0")
  assert bad.returncode == 2 and b"attention_sentences" in bad.stderr
  assert b"Traceback" not in bad.stderr


def test_translator_ensemble_of_two_checkpoints(workdir):
  from flax_transformer.averaging import load_params
  from flax_transformer.workdir import read_run

  config, tokenizer = read_run(workdir)
  first, _ = load_params(workdir, config, checkpoint_step=FIRST)
  last, _ = load_params(workdir, config, checkpoint_step=LAST)
  search = SearchConfig(beam_size=2, max_extra=5)
  sentences = ["A dog runs.", "", "Two men talk on a bench."]
  both = Translator([config, config], [first, last], tokenizer, search).translate(sentences)
  assert len(both) == 3 and both[1] == "" and both[0]
  # From workdirs: a model voting with itself is the model.
  alone = Translator.from_workdir(workdir, search=SearchConfig(beam_size=2, max_extra=5))
  itself = Translator.from_workdir(workdir,
                                   search=SearchConfig(beam_size=2, max_extra=5),
                                   ensemble=[workdir])
  assert itself.checkpoint_steps == ([LAST], [LAST])
  assert itself.translate(sentences) == alone.translate(sentences)


def test_decode_cli_ensemble_of_different_vocabularies_is_one_clear_error(workdir, tmp_path):
  import shutil

  from flax_transformer.data.tokenizer import train_tokenizer

  other = tmp_path / "other"
  other.mkdir()
  shutil.copy(workdir / "run.json", other / "run.json")
  train_tokenizer(["a dog runs", "two men talk", "a girl sits on a bench"] * 20,
                  other / "vocab.model", vocab_size=40)
  result = decode(workdir, f"--ensemble={other}", stdin=b"A dog.\n")
  assert result.returncode == 2
  stderr = result.stderr.decode()
  assert "ensemble" in stderr and "vocabulary" in stderr and str(other) in stderr
  assert "Traceback" not in stderr


def test_decode_cli_reads_pipes_and_dev_null_and_names_a_directory(tmp_path):
  """--input (and --reference, --score, --prefix) as a shell hands them over: a pipe from
  process substitution or /dev/null is input; a directory or a missing path is one error."""
  import os
  import threading

  from flax_transformer.cli.translate import _read
  from flax_transformer.errors import DataError

  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  writer = threading.Thread(target=lambda: fifo.write_bytes(b"A dog.\nTwo cats.\n"), daemon=True)
  writer.start()
  assert _read(str(fifo), "--input") == ["A dog.", "Two cats."]
  writer.join()
  assert _read("/dev/null", "--input") == []
  with pytest.raises(DataError, match="is a directory"):
    _read(str(tmp_path), "--input")
  with pytest.raises(DataError, match="does not exist"):
    _read(str(tmp_path / "missing"), "--input")


def test_decode_cli_missing_workdir_is_one_clear_error(tmp_path):
  result = decode(tmp_path / "nothing")
  assert result.returncode == 2
  assert result.stderr.decode().strip().startswith("error: workdir")
  assert b"Traceback" not in result.stderr


# Runs an entry point's main once per argv (json) in one process, flags reset between
# runs, stdin one sentence each: a launch per value would pay Python's and jax's start
# each time (about 1.2 s). Prints per run {"code", "stderr"} as one json line, up to
# the first that does not exit 2 (an unchecked value searches, or serves).
FLAG_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
from absl import flags
from flax_transformer.cli import common as cli
script = runpy.run_path(sys.argv[1])  # Not as __main__: no re-exec, no app.run.
runs = []
for argv in json.loads(sys.argv[2]):
  flags.FLAGS.unparse_flags()
  sys.stdin = io.TextIOWrapper(io.BytesIO(b"A dog runs.\\n"))
  stderr = io.StringIO()
  with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
    try:
      script["main"](cli.parse_flags_or_exit([sys.argv[1], *argv]))
      code = 0
    except SystemExit as e:
      code = e.code
    except BaseException:
      traceback.print_exc()
      code = 1
  runs.append({"code": code, "stderr": stderr.getvalue()})
  if code != 2:
    break
print(json.dumps(runs))
"""

# Every search flag's out-of-range values (SearchConfig's one check; serve's requests:
# test_serve.BAD): (flags, the words of the error). {vocab}: the model's vocabulary size.
BAD_SEARCH_FLAGS = [
    (["--beam_size=0"], "beam_size must be >= 1, got 0"),
    (["--beam_size=-3"], "beam_size must be >= 1, got -3"),
    (["--nbest=0"], "nbest must be in [1, beam_size=4], got 0"),
    (["--nbest=5"], "nbest must be in [1, beam_size=4], got 5"),
    (["--alpha=-0.5"], "alpha must be in [0, 10], got -0.5"),
    (["--alpha=10.5"], "alpha must be in [0, 10], got 10.5"),
    (["--alpha=nan"], "alpha must be in [0, 10], got nan"),
    (["--alpha=inf"], "alpha must be in [0, 10], got inf"),
    (["--max_extra=-20"], "max_extra must be >= 0, got -20"),
    (["--temperature=-1"], "temperature must be 0 (beam search; greedy with beam_size 1) or "
                           "in [0.001, 100], got -1.0"),
    (["--temperature=1e-9"], "got 1e-09"),
    (["--temperature=1e7"], "got 10000000.0"),
    (["--temperature=inf"], "got inf"),
    (["--temperature=nan"], "got nan"),
    (["--temperature=1", "--nbest=2"], "nbest must be 1 when sampling (temperature > 0)"),
    (["--top_k=-1"], "top_k must be >= 0 (0 = every token), got -1"),
    (["--temperature=1", "--top_k={vocab_plus_1}"],
     "top_k must be at most the vocabulary's {vocab} tokens (0 = every token), got "
     "{vocab_plus_1}"),
    (["--top_p=0"], "top_p must be in (0, 1], got 0.0"),
    (["--top_p=-0.5"], "top_p must be in (0, 1], got -0.5"),
    (["--top_p=1.5"], "top_p must be in (0, 1], got 1.5"),
    (["--top_p=nan"], "top_p must be in (0, 1], got nan"),
]
SERVE_AND_EXPORT_FLAGS = ("--beam_size", "--alpha", "--max_extra")  # Their search flags.
# Beams no memory holds, refused before anything compiles: over the search's int32
# candidate indices (beam x vocabulary), and over search_memory's estimate against the
# device's memory (here the host's: 9 TiB for one sentence). serve.py: with --max_beam
# as large, whose own check would name them first.
TOO_LARGE = [
    (["--beam_size=100000000"], "beam_size=100000000 x the vocabulary's {vocab} tokens is "
                                "over 2^31 - 1 candidates per sentence"),
    (["--beam_size=100000"], "beam_size=100000: a search of "),
]


@pytest.mark.parametrize("script", ["decode.py", "serve.py", "export.py"])
def test_every_bad_search_flag_is_one_error_line_and_exit_2(workdir, script, tmp_path):
  """Each out-of-range value of each search flag, through the script's own flag parsing
  and main: exit 2 and one line naming the option, never a traceback or a search."""
  from flax_transformer.workdir import read_run

  vocab = read_run(workdir)[0].vocab_size
  fill = lambda text: text.format(vocab=vocab, vocab_plus_1=vocab + 1)  # noqa: E731
  cases = [([fill(f) for f in flags], fill(words)) for flags, words in BAD_SEARCH_FLAGS
           if script == "decode.py" or all(f.split("=")[0] in SERVE_AND_EXPORT_FLAGS
                                           for f in flags)]
  if script == "serve.py":  # Else every request without a beam_size would be a 422.
    cases.append((["--beam_size=9", "--max_beam=8"], "--beam_size 9 is over --max_beam 8"))
  wide = ["--max_beam=100000000"] if script == "serve.py" else []
  cases += [([*flags, *wide], fill(words)) for flags, words in TOO_LARGE]
  given = {"decode.py": [f"--compilation_cache_dir={conftest.XLA_CACHE}"],
           "serve.py": ["--port=0"], "export.py": [f"--out={tmp_path / 'out'}"]}[script]
  argvs = [[f"--workdir={workdir}", *given, *flags] for flags, _ in cases]
  done = subprocess.run([sys.executable, "-c", FLAG_DRIVER, str(ROOT / script),
                         json.dumps(argvs)], capture_output=True, text=True,
                        env=conftest.cpu_env(), timeout=180)  # Seconds, when all are refused.
  assert done.returncode == 0, done.stderr[-3000:]
  runs = json.loads(done.stdout.splitlines()[-1])
  for (flags, words), run in zip(cases, runs):
    lines = run["stderr"].strip().splitlines()
    assert run["code"] == 2 and len(lines) == 1, (flags, run)
    assert lines[0].startswith("error: ") and words in lines[0], (flags, lines)
  assert len(runs) == len(cases)
  if script == "decode.py":  # And as a shell launches it: the same line, exit 2.
    launched = decode(workdir, "--top_p=0", stdin=b"A dog runs.\n")
    assert launched.returncode == 2
    assert launched.stderr.decode().strip() == next(
        run["stderr"].strip() for (flags, _), run in zip(cases, runs) if flags == ["--top_p=0"])


# Options of the wrong type through the Python API (the scripts' flags cannot carry them:
# absl's integer and bool flags refuse 2.5 and "no"; serve's requests: pydantic's strict
# types, test_serve.BAD): (options, the one-line error).
BAD_SEARCH_TYPES = [
    (dict(beam_size=2.5), "beam_size must be an integer, got 2.5 (float)"),
    (dict(beam_size=True), "beam_size must be an integer, got True (bool)"),
    (dict(max_extra=1.5), "max_extra must be an integer, got 1.5 (float)"),
    (dict(nbest="2"), "nbest must be an integer, got '2' (str)"),
    (dict(top_k=None), "top_k must be an integer, got None (NoneType)"),
    (dict(alpha="0.6"), "alpha must be a number, got '0.6' (str)"),
    (dict(alpha=False), "alpha must be a number, got False (bool)"),
    (dict(temperature=np.bool_(True)), "temperature must be a number, got np.True_ (bool)"),
    (dict(top_p=[1.0]), "top_p must be a number, got [1.0] (list)"),
    (dict(eos_within_beam="no"), "eos_within_beam must be True or False, got 'no' (str)"),
    (dict(eos_within_beam=1), "eos_within_beam must be True or False, got 1 (int)"),
]


def test_every_search_option_of_the_wrong_type_is_one_config_error():
  from flax_transformer.errors import ConfigError

  for options, words in BAD_SEARCH_TYPES:
    with pytest.raises(ConfigError) as error:
      SearchConfig(**options)
    assert str(error.value) == words, options
  # numpy's integers, floats and bools are of their types, and kept as Python's: a beam
  # of np.uint8(4) was an OverflowError traceback in check_vocabulary (4 x 511 tokens).
  search = SearchConfig(beam_size=np.uint8(4), alpha=np.float32(0.5), max_extra=np.int8(100),
                        eos_within_beam=np.True_)
  assert search == SearchConfig(beam_size=4, alpha=float(np.float32(0.5)), max_extra=100,
                                eos_within_beam=True)
  assert [type(getattr(search, f.name)) for f in dataclasses.fields(search)] == [
      f.type for f in dataclasses.fields(search)]
  search.check_vocabulary(511)
  with pytest.raises(ConfigError, match=r"^alpha must be in \[0, 10\], got 1000"):
    SearchConfig(alpha=10**400)  # No float holds it: refused by its range, not overflowing.


def test_a_search_no_memory_holds_is_refused_before_it_compiles(workdir):
  """Through the Python API (the scripts: the sweep above): one ConfigError line from the
  estimate, nothing compiled; a beam that fits is searched by the same translator kind."""
  from flax_transformer.errors import ConfigError

  translator = Translator.from_workdir(workdir, search=SearchConfig(beam_size=100_000,
                                                                    max_extra=5))
  with pytest.raises(ConfigError, match=r"^beam_size=100000: a search of 1 sentence\(s\) x 16 "
                                        r"tokens \(outputs up to 21\) needs at least [\d.]+ TiB, "
                                        r"over the [\d.]+ [KMGT]iB of the host's available memory"
                                        r".*: use a smaller beam_size, max_extra or batch "
                                        r"\(decode.py's --batch_tokens, serve.py's "
                                        r"--max_batch, the Translator's batch_tokens\)"):
    translator.translate(["A dog runs."])
  assert translator._search_fn.num_shapes == 0


def test_average_checkpoints_cli_writes_a_decodable_workdir(workdir, tmp_path):
  from flax_transformer.averaging import load_params
  from flax_transformer.workdir import read_run

  env = conftest.cpu_env()
  output = tmp_path / "avg"
  result = subprocess.run([sys.executable, str(ROOT / "average_checkpoints.py"),
                           f"--workdir={workdir}", "--last=2", f"--output={output}"],
                          env=env, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
  config, _ = read_run(output)
  averaged, steps = load_params(output, config)
  assert steps == [LAST]
  assert load_params(workdir, config, average_last=1)[1] == [LAST]  # The newest, not the first.
  a, _ = load_params(workdir, config, checkpoint_step=FIRST)
  b, _ = load_params(workdir, config, checkpoint_step=LAST)
  for x, y, m in zip(*(jax.tree_util.tree_leaves(t) for t in (a, b, averaged))):
    np.testing.assert_allclose(m, (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6, atol=1e-7)
  assert decode(output, stdin=b"A dog.\n").returncode == 0
  again = subprocess.run([sys.executable, str(ROOT / "average_checkpoints.py"),
                          f"--workdir={workdir}", "--last=2", f"--output={output}"],
                         env=env, capture_output=True, text=True)
  assert again.returncode == 2 and "not empty" in again.stderr


@pytest.mark.devices(8)
def test_search_under_an_eight_device_data_mesh_equals_one_device():
  from jax.sharding import NamedSharding, PartitionSpec

  from flax_transformer.training import sharding

  cfg, params = random_model(20, seed=4)
  search_fn = make_search_fn(cfg, SearchConfig(beam_size=2, max_extra=4))
  inputs = np.random.default_rng(1).integers(2, 20, (8, 6)).astype(np.int32)
  inputs[:, -1] = EOS
  single = jax.jit(search_fn)(params, jnp.asarray(inputs), jax.random.PRNGKey(0))
  mesh = sharding.make_mesh({"data": 8})
  placed = jax.device_put(inputs, sharding.batch_sharding(mesh))
  with jax.set_mesh(mesh):
    sharded = jax.jit(search_fn, out_shardings=NamedSharding(mesh, PartitionSpec()))(
        params, placed, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(sharded.sequences, single.sequences)
  np.testing.assert_allclose(sharded.scores, single.scores, atol=1e-5)


def test_search_and_vocabulary_agree_on_padding_and_end_ids():
  """The search keeps its own ids (it imports nothing of the package); they must be
  the vocabulary's."""
  import inspect

  from flax_transformer.data import tokenizer

  assert decoding.PAD_ID == tokenizer.PAD_ID
  for fn in (decoding.beam_search, decoding.sample_search):
    assert inspect.signature(fn).parameters["eos_id"].default == tokenizer.EOS_ID
