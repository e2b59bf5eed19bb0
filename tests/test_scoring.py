"""Translator.score and forced target prefixes, on the session's trained tiny run: the
scores against the teacher-forced log-softmax summed by hand, an n-best list rescored
with a second checkpoint, prefixes in beam search, n-best and sampling; decode.py's
--score and --prefix."""

import functools
import gzip
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from flax_transformer import Transformer
from flax_transformer.averaging import load_params
from flax_transformer.cli.translate import run_decode
from flax_transformer.data.tokenizer import EOS_ID
from flax_transformer.errors import DataError
from flax_transformer.translation.search import NEG_INF, length_penalty
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.translator import Translator
from flax_transformer.workdir import read_run

import conftest
from conftest import TRAINED_TINY_CHECKPOINTS

ROOT = Path(__file__).resolve().parents[1]
FIRST, LAST = TRAINED_TINY_CHECKPOINTS
# 8 rows of width 16: one batch shape (one compile per program), a row per device.
BATCH_TOKENS = 128
SEARCH = SearchConfig(beam_size=4, max_extra=5, nbest=4)


@pytest.fixture(scope="module")
def sentences(multi30k_dir, trained_tiny):
  """Eight validation sentences of at most 15 tokens (with EOS): one batch."""
  _, tokenizer = read_run(trained_tiny)
  with gzip.open(Path(multi30k_dir) / "val.en.gz", "rt") as f:
    lines = [line.rstrip("\n") for line in f]
  return [s for s in lines if len(tokenizer.tokenize(s)) <= 15][:8]


@pytest.fixture(scope="module")
def beam(trained_tiny):
  """The newest checkpoint, beam 4, its 4 best; sentences split over the 8 devices."""
  return Translator.from_workdir(trained_tiny, search=SEARCH, batch_tokens=BATCH_TOKENS)


@pytest.fixture(scope="module")
def nbest(beam, sentences):
  return beam.translate_nbest(sentences)


@functools.partial(jax.jit, static_argnums=0)
def teacher_forced_logits(config, params, inputs, targets):
  return Transformer(config).apply({"params": params}, inputs, targets)


def by_hand(translator, members_params, sources, targets):
  """[(log P, tokens)] per pair: each member's teacher-forced logits (model.apply), their
  log-softmax in float64 numpy, the log of the members' mean probability per token, summed
  over the target's tokens, EOS included."""
  tokenize = translator.tokenizer.tokenize
  pairs = [(tokenize(s), tokenize(t)) for s, t in zip(sources, targets)]
  inputs, outputs = np.zeros((2, len(pairs), 32), np.int32)
  for row, (source, target) in enumerate(pairs):
    inputs[row, :len(source)], outputs[row, :len(target)] = source, target
  probs = []
  for params in members_params:
    logits = np.asarray(teacher_forced_logits(translator.model_config, params, inputs, outputs),
                        np.float64)
    top = logits.max(-1, keepdims=True)
    probs.append(np.exp(logits - top) / np.exp(logits - top).sum(-1, keepdims=True))
  log_probs = np.log(np.mean(probs, axis=0))
  return [(sum(log_probs[row, t, token] for t, token in enumerate(target)), len(target))
          for row, (_, target) in enumerate(pairs)]


def checkpoint(workdir, step):
  config, _ = read_run(workdir)
  return load_params(workdir, config, checkpoint_step=step)[0]


def test_score_is_the_teacher_forced_log_softmax_summed_by_hand(trained_tiny, beam, sentences):
  sources = sentences[:6] + ["", "A dog."]
  targets = ["Ein Hund rennt.", "Zwei Männer", "", "x" * 3, "Ein Mann fährt Fahrrad.",
             "Eine Frau singt.", "Ein Hund.", ""]
  scored = beam.score(sources, targets)
  hand = by_hand(beam, [beam.member(0)[1]], sources, targets)
  assert [n for _, n in scored] == [n for _, n in hand]
  assert scored[2][1] == 1 and scored[0][0] < scored[2][0] < 0  # '' is its EOS alone.
  np.testing.assert_allclose([s for s, _ in scored], [s for s, _ in hand], rtol=1e-5, atol=1e-4)
  # An ensemble of the two checkpoints: per token, the log of the mean probability.
  members = [checkpoint(trained_tiny, FIRST), checkpoint(trained_tiny, LAST)]
  config = beam.model_config
  ensemble = Translator([config, config], members, beam.tokenizer, SEARCH,
                        batch_tokens=BATCH_TOKENS)
  together = ensemble.score(sources, targets)
  np.testing.assert_allclose([s for s, _ in together],
                             [s for s, _ in by_hand(beam, members, sources, targets)],
                             rtol=1e-5, atol=1e-4)
  with pytest.raises(DataError, match=r"line 2: the target has \d+ tokens \(EOS included\), "
                                      "more than the model.s max_len of 64"):
    beam.score(["A", "B"], ["Ja", "ja " * 70])


def test_rescoring_an_nbest_list_with_a_second_model(trained_tiny, beam, nbest, sentences):
  sources = [s for s, hyps in zip(sentences, nbest) for _ in hyps]
  hypotheses = [text for hyps in nbest for text, _ in hyps]
  # Rescored with the earlier checkpoint by the search's criterion, log P / lp.
  lp = np.array([penalty(len(beam.tokenizer.tokenize(h))) for h in hypotheses])
  second = Translator.from_workdir(trained_tiny, search=SEARCH, batch_tokens=BATCH_TOKENS,
                                   checkpoint_step=FIRST)
  rescored = np.array([s for s, _ in second.score(sources, hypotheses)]) / lp
  hand = np.array([s for s, _ in by_hand(beam, [checkpoint(trained_tiny, FIRST)], sources,
                                         hypotheses)]) / lp
  k = SEARCH.nbest
  choice, expected = rescored.reshape(-1, k).argmax(1), hand.reshape(-1, k).argmax(1)
  # The hand sums decide clearly (no near ties), and the rescoring follows them.
  margins = np.sort(hand.reshape(-1, k), axis=1)
  assert (margins[:, -1] - margins[:, -2] > 1e-3).all()
  np.testing.assert_array_equal(choice, expected)
  # Both kinds occur: the second model keeps the first's best for some, not for others.
  assert 0 < (expected != 0).sum() < len(sentences), expected


def words(text, count):
  return " ".join(text.split()[:count])


def penalty(tokens):
  return float(length_penalty(np.int32(tokens), SEARCH.alpha))


def at_the_length_limit(translator, sentence):
  """A prefix exactly as long as `sentence`'s outputs may be (its tokens + max_extra):
  only the room the search makes for a prefix and its EOS lets it be forced whole."""
  tokenize = translator.tokenizer.tokenize
  most = len(tokenize(sentence)) + translator.search.max_extra
  words = "Eine Frau sitzt an einer und ein Mann mit einem".split() * 3  # A token each.
  prefix = next((p for p in (" ".join(words[:n]) for n in range(1, len(words)))
                 if len(tokenize(p)) - 1 >= most), None)
  assert prefix is not None and len(tokenize(prefix)) - 1 == most, (sentence, prefix)
  return prefix


def check_scores_count_every_token(translator, sources, prefixes, divide_by_lp):
  """Searched from ids, each hypothesis starts with its prefix's ids, and its score is
  `score_ids` of its ids (forced ones included), / lp(|Y|) for beam search."""
  tokenize = translator.tokenizer.tokenize
  source_ids, prefix_ids = [tokenize(s) for s in sources], [tokenize(p)[:-1] for p in prefixes]
  found = translator.translate_nbest_ids(source_ids, prefix_ids)
  pairs = [(source, np.array(ids + [EOS_ID]), score)
           for source, prefix, hyps in zip(source_ids, prefix_ids, found)
           for ids, score in hyps if score > NEG_INF  # An n-best slot without a hypothesis.
           and (ids[:len(prefix)] == list(prefix) or pytest.fail(ids))]
  scored = translator.score_ids([s for s, _, _ in pairs], [t for _, t, _ in pairs])
  expected = [s / (penalty(n) if divide_by_lp else 1.0) for s, n in scored]
  np.testing.assert_allclose([score for _, _, score in pairs], expected, rtol=1e-5)


def test_prefixes_in_beam_search_and_nbest(beam, nbest, sentences):
  own = [words(hyps[0][0], 2) for hyps in nbest]
  # Per sentence: nothing, the model's own first two words, or words it would not choose
  # (the last: as many as the sentence's outputs may hold, source tokens + max_extra).
  prefixes = ["", own[1], "Zwei Katzen", "", own[4], "Eine Frau und", own[6],
              at_the_length_limit(beam, sentences[7])]
  forced = beam.translate_nbest(sentences, prefixes=prefixes)
  # The last prefix fills its outputs' room: one hypothesis, the prefix then EOS; the
  # other slots hold none ('' scored NEG_INF, test_decoding's n-best padding).
  assert forced[7] == [(prefixes[7], forced[7][0][1])] + [("", NEG_INF)] * (SEARCH.nbest - 1)
  for prefix, hyps, alone in zip(prefixes[:7], forced, nbest):
    assert len(hyps) == SEARCH.nbest
    if not prefix:  # No prefix: the search without prefixes, bit for bit.
      assert hyps == alone
    for text, _ in hyps:
      assert text.startswith(prefix), (prefix, text)
  for i in (1, 4, 6):  # Its own best's beginning: the same best.
    assert forced[i][0] == nbest[i][0]
  check_scores_count_every_token(beam, sentences, prefixes, divide_by_lp=True)
  # Prefixes of 0 to 3 tokens, one program; all empty: the search without prefixes.
  assert [d for d in beam._search_fn.compile_seconds if "prefixes" in d] == \
      ["inputs [8, 16], prefixes [8, 16]"]
  assert beam.translate_nbest(sentences, prefixes=[""] * len(sentences)) == nbest


def test_prefixes_in_sampling(trained_tiny, sentences):
  sampler = Translator.from_workdir(trained_tiny, batch_tokens=BATCH_TOKENS, seed=5,
                                    search=SearchConfig(temperature=1.0, max_extra=5))
  drawn = sampler.translate_nbest(sentences)
  prefixes = ["Zwei Katzen", "Ein", "", "Eine Frau und"] * 2
  forced = sampler.translate_nbest(sentences, prefixes=prefixes)
  for prefix, hyps, free in zip(prefixes, forced, drawn):
    assert hyps[0][0].startswith(prefix), (prefix, hyps)
    if not prefix:  # The same draws as without prefixes (the same batch, key and rows).
      assert hyps == free
  check_scores_count_every_token(sampler, sentences, prefixes, divide_by_lp=False)
  # A prefix as long as the outputs may be: forced whole, then EOS. (Alone: in the batch
  # above it would sort last and move the other rows, and their draws.)
  longest = at_the_length_limit(sampler, sentences[7])
  assert sampler.translate([sentences[7]], prefixes=[longest]) == [longest]


def decode(workdir, *args):
  env = conftest.cpu_env()
  return subprocess.run([sys.executable, str(ROOT / "decode.py"), f"--workdir={workdir}",
                         f"--batch_tokens={BATCH_TOKENS}", "--max_extra=5", "--cpu_devices=8",
                         "--average_last=1", f"--compilation_cache_dir={conftest.XLA_CACHE}",
                         *args], capture_output=True, env=env)


def test_decode_cli_scores_targets(trained_tiny, beam, sentences, tmp_path):
  (tmp_path / "in.en").write_text("\n".join(sentences[:3]) + "\n")
  targets = ["Ein Hund rennt.", "", "Zwei Männer sitzen."]
  (tmp_path / "t.de").write_text("\n".join(targets) + "\n")
  done = decode(trained_tiny, f"--input={tmp_path / 'in.en'}", f"--score={tmp_path / 't.de'}")
  assert done.returncode == 0, done.stderr.decode()
  expected = [f"{s:.4f}\t{n}" for s, n in beam.score(sentences[:3], targets)]
  assert done.stdout.decode().splitlines() == expected
  # Line counts that differ: an error naming both files (one line, exit 2: --prefix's, below).
  (tmp_path / "short.de").write_text("Ein Hund.\n")
  with pytest.raises(DataError, match=f"^--score {tmp_path / 'short.de'} has 1 lines but "
                                      f"--input {tmp_path / 'in.en'} has 3$"):
    run_decode(workdir=str(trained_tiny), input_path=str(tmp_path / "in.en"), output_path="-",
               reference=None, metrics=[], sacrebleu_tokenize=None, attention_plot=None,
               score_path=str(tmp_path / "short.de"))


def test_decode_cli_prefixes(trained_tiny, beam, sentences, tmp_path):
  (tmp_path / "in.en").write_text("\n".join(sentences[:3]) + "\n")
  prefixes = ["Zwei Katzen", "", "Ein"]
  (tmp_path / "p.de").write_text("\n".join(prefixes) + "\n")
  # In-process (the compiled searches of `beam` serve it); the flag's reading, below.
  run_decode(workdir=str(trained_tiny), input_path=str(tmp_path / "in.en"),
             output_path=str(tmp_path / "out.de"), reference=None, metrics=[],
             sacrebleu_tokenize=None, attention_plot=None,
             compilation_cache_dir=conftest.XLA_CACHE, prefix_path=str(tmp_path / "p.de"),
             search=SEARCH, batch_tokens=BATCH_TOKENS, average_last=1)
  out = (tmp_path / "out.de").read_text().splitlines()
  assert len(out) == 3 * SEARCH.nbest
  expected = beam.translate_nbest(sentences[:3], prefixes=prefixes)
  assert out == [f"{i} ||| {text} ||| {score:.4f}" for i, hyps in enumerate(expected)
                 for text, score in hyps]
  with pytest.raises(DataError, match=r"--prefix \S+p.de: line 1: the prefix has \d+ tokens; "
                                      "the model.s outputs hold at most 63"):
    (tmp_path / "p.de").write_text("a " * 64 + "\n\n\n")
    run_decode(workdir=str(trained_tiny), input_path=str(tmp_path / "in.en"),
               output_path=str(tmp_path / "out.de"), reference=None, metrics=[],
               sacrebleu_tokenize=None, attention_plot=None, prefix_path=str(tmp_path / "p.de"),
               search=SEARCH, batch_tokens=BATCH_TOKENS, average_last=1)
  (tmp_path / "p.de").write_text("Ein\n")
  bad = decode(trained_tiny, f"--input={tmp_path / 'in.en'}", f"--prefix={tmp_path / 'p.de'}")
  assert bad.returncode == 2 and b"Traceback" not in bad.stderr
  assert (f"error: --prefix {tmp_path / 'p.de'} has 1 lines but --input "
          f"{tmp_path / 'in.en'} has 3").encode() in bad.stderr
