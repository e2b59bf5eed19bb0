"""Mutation check: each paper-critical detail, broken on purpose, must fail its tests.

python bench/mutants.py [--only NAME ...] [--json results/bench/mutants.json]

Each mutant is one patch (a unique piece of text in one file and its replacement) and
the tests named for it, run with pytest on a scratch copy of the checkout (tracked and
untracked files, not ignored), which is restored after each. "caught": a test failed;
"missed": they passed with the detail broken; "timeout" (over --timeout) and "error"
(any other exit) catch nothing. The unmutated tests run first: a mutant only counts
against tests that pass without it. Exit 0 when every mutant is caught, else 1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from common import MULTI30K, ROOT, bench_command, parser, write_json

RECIPE = "tests/test_recipe.py"
PAPER = "tests/test_paper.py"
STEPS = "flax_transformer/training/steps.py"
LAYERS = "flax_transformer/network/layers.py"
MODEL = "flax_transformer/network/model.py"
ATTENTION = "flax_transformer/network/attention.py"
SEARCH = "flax_transformer/translation/search.py"
TRANSLATOR = "flax_transformer/translation/translator.py"
AVERAGING = "flax_transformer/averaging.py"
DEFAULTS = "configs/default.py"


class Mutant(NamedTuple):
  name: str
  file: str
  old: str  # Must occur exactly once in `file`.
  new: str
  tests: tuple[str, ...]  # pytest node ids or files.


MUTANTS = [
    # --- Label smoothing (section 5.4) ---------------------------------------------
    Mutant("train step without label smoothing", STEPS,
           'cross_entropy_sums(logits, batch["targets"], self.config.label_smoothing,\n'
           '                              with_accuracy=False, fused_backward=self.fused_backward)',
           'cross_entropy_sums(logits, batch["targets"], 0.0,\n'
           '                              with_accuracy=False)', (RECIPE,)),
    Mutant("smoothing mass not spread over the vocabulary (backward)", STEPS,
           "- g_loss * (label_smoothing / vocab))", "- g_loss * label_smoothing)",
           ("tests/test_training.py::test_label_smoothed_loss_gradients_match_optax",
            RECIPE)),
    Mutant("default label smoothing 0", DEFAULTS, "config.label_smoothing = 0.1",
           "config.label_smoothing = 0.0", (RECIPE,)),
    # --- Learning-rate schedule (eq. 3) ------------------------------------------
    Mutant("warmup exponent -1 instead of -1.5", STEPS, "step * warmup_steps ** -1.5",
           "step * warmup_steps ** -1.0",
           ("tests/test_training.py::test_schedule_is_the_papers_formula", RECIPE)),
    Mutant("schedule steps counted from 0", STEPS,
           "step = jnp.asarray(count, jnp.float32) + 1.0",
           "step = jnp.asarray(count, jnp.float32) + 0.5", (RECIPE,)),
    Mutant("trainer's schedule on d_ff instead of d_model", STEPS,
           "learning_rate_schedule(model_config.d_model, config.warmup_steps,",
           "learning_rate_schedule(model_config.d_ff, config.warmup_steps,", (RECIPE,)),
    # --- Adam (section 5.3) ------------------------------------------------------
    Mutant("Adam beta2 0.999 in the optimiser", STEPS,
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)",
           "optax.adam(schedule, b1=config.adam_b1, b2=0.999, eps=config.adam_eps)", (RECIPE,)),
    Mutant("Adam beta1 0.8 in the optimiser", STEPS,
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)",
           "optax.adam(schedule, b1=0.8, b2=config.adam_b2, eps=config.adam_eps)", (RECIPE,)),
    Mutant("Adam epsilon 1e-8 in the optimiser", STEPS,
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)",
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=1e-8)", (RECIPE,)),
    Mutant("default Adam epsilon 1e-8", DEFAULTS, "config.adam_eps = 1e-9",
           "config.adam_eps = 1e-8", (RECIPE,)),
    Mutant("default Adam beta2 0.999", DEFAULTS, "config.adam_b2 = 0.98",
           "config.adam_b2 = 0.999", (RECIPE,)),
    Mutant("gradients not normalised per target token", STEPS,
           "grads = jax.tree_util.tree_map(lambda g: g / tokens, grads)",
           "grads = jax.tree_util.tree_map(lambda g: g / 10.0, grads)", (RECIPE,)),
    # --- Dropout (section 5.4) ---------------------------------------------------
    Mutant("train step runs the deterministic model", STEPS,
           "Transformer(model_config.replace(deterministic=False, decode=False))",
           "Transformer(model_config.replace(deterministic=True, decode=False))", (RECIPE,)),
    Mutant("sub-layer dropout rate 0", LAYERS,
           "dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)",
           "dropout = Dropout(0.0, deterministic=cfg.deterministic)", (PAPER, RECIPE)),
    Mutant("no dropout on the decoder's embedding sums", MODEL,
           "y = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)(y)",
           "y = Dropout(0.0, deterministic=cfg.deterministic)(y)", (PAPER, RECIPE)),
    Mutant("dropout survivors not rescaled", LAYERS,
           "jnp.asarray(1.0 / (1.0 - self.rate), x.dtype)", "jnp.asarray(1.0, x.dtype)",
           (PAPER, "tests/test_model.py::test_dropout_mask_rate_and_scaling")),
    # --- Attention (section 3.2.1) -----------------------------------------------
    Mutant("attention logits scaled by 1/d_k (unfused path)", ATTENTION,
           "/ np.sqrt(d_k).astype(np.float32)", "/ np.float32(d_k)",
           ("tests/test_attention.py",)),
    Mutant("attention logits unscaled (XLA fused path)", ATTENTION,
           'return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")',
           'return jax.nn.dot_product_attention(query, key, value, mask=mask, scale=1.0, '
           'implementation="xla")', ("tests/test_attention.py",)),
    # --- Causal decoder (section 3.2.3) ------------------------------------------
    Mutant("no causal mask in training", MODEL,
           "self_mask = combine_masks(padding_mask(targets, targets), "
           "causal_mask(targets.shape[1]))",
           "self_mask = combine_masks(padding_mask(targets, targets))",
           ("tests/test_model.py::test_causality",)),
    Mutant("causal mask lets each position see the next", ATTENTION,
           "jnp.tril(jnp.ones((length, length), dtype=bool))",
           "jnp.tril(jnp.ones((length, length), dtype=bool), 1)",
           ("tests/test_model.py::test_causality", "tests/test_attention.py")),
    Mutant("targets not shifted right", MODEL,
           "decoder_inputs = shift_right(targets, targets_segmentation)",
           "decoder_inputs = targets", ("tests/test_model.py::test_causality",)),
    # --- Embeddings and the tied projection (section 3.4) -------------------------
    Mutant("untied output projection", MODEL, "if cfg.share_embeddings:\n      logits",
           "if False:\n      logits", (PAPER,)),
    Mutant("no gradient into the embedding from the output projection", LAYERS,
           "return (g2 @ embedding).reshape(x.shape), (x2.T @ g2).T",
           "return (g2 @ embedding).reshape(x.shape), 0.0 * (x2.T @ g2).T",
           ("tests/test_model.py::test_tied_projection_gradients_match_autodiff", RECIPE)),
    Mutant("embeddings not scaled by sqrt(d_model)", LAYERS,
           "return x * jnp.asarray(np.sqrt(cfg.d_model), cfg.dtype)",
           "return x * jnp.asarray(1.0, cfg.dtype)", (PAPER,)),
    Mutant("sinusoid wavelengths on i instead of 2i", LAYERS,
           "two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]",
           "two_i = np.arange(0, d_model // 2, dtype=np.float64)[None, :]",
           ("tests/test_model.py::test_sinusoidal_encoding_matches_formula", PAPER)),
    # --- Residual and normalisation (section 3.1) --------------------------------
    Mutant("pre-LN instead of the paper's post-LN", LAYERS,
           'return layer_norm(cfg, "norm")(x + dropout(sublayer(x)))',
           'return x + dropout(sublayer(layer_norm(cfg, "norm")(x)))', (PAPER,)),
    # --- Checkpoint averaging (section 6.1) ----------------------------------------
    Mutant("averaging divides by one more checkpoint", AVERAGING,
           "scale = np.float32(1.0 / len(steps))", "scale = np.float32(1.0 / (len(steps) + 1))",
           ("tests/test_reliability.py::test_average_is_the_elementwise_mean",)),
    Mutant("'average' of the first and last checkpoint only", AVERAGING,
           "  for step in steps:\n    params = checkpointer.restore_params(step, abstract)",
           "  for step in (steps[0], steps[-1]) if len(steps) > 2 else steps:\n"
           "    params = checkpointer.restore_params(step, abstract)",
           ("tests/test_reliability.py::test_average_is_the_elementwise_mean",)),
    Mutant("the oldest checkpoints averaged instead of the newest", AVERAGING,
           "chosen = steps[-average_last:]", "chosen = steps[:average_last]",
           ("tests/test_decoding.py::test_average_checkpoints_cli_writes_a_decodable_workdir",)),
    # --- Beam search (section 6.1) ------------------------------------------------
    Mutant("length penalty (5 + |Y|) / 5", SEARCH, "/ 6.0) ** alpha", "/ 5.0) ** alpha",
           ("tests/test_decoding.py::test_beam_equals_exhaustive_search", PAPER)),
    Mutant("finished hypotheses penalised one token short", SEARCH,
           "new_scores = top_log_probs / length_penalty(s.step + 1, alpha)",
           "new_scores = top_log_probs / length_penalty(s.step, alpha)",
           ("tests/test_decoding.py::test_beam_equals_exhaustive_search", PAPER)),
    Mutant("early stop bounds live beams at their current length", SEARCH,
           "best_alive = s.alive_log_probs[:, 0] / length_penalty(max_lengths, alpha)",
           "best_alive = s.alive_log_probs[:, 0] / length_penalty(s.step + 1, alpha)", (PAPER,)),
    Mutant("no early stop", SEARCH, "return (s.step < length) & jnp.any(open_sentence)",
           "return s.step < length", (PAPER,)),
    # --- Search options and forced prefixes (issue 68) -------------------------------
    Mutant("a forced prefix gets no room past the length limit", SEARCH,
           "    max_lengths = jnp.maximum(max_lengths, forced_lengths + 1)\n",
           "    pass\n", ("tests/test_scoring.py::test_prefixes_in_beam_search_and_nbest",)),
    Mutant("alpha's range unchecked (decode.py, serve.py, the API)", TRANSLATOR,
           "if not 0 <= self.alpha <= MAX_ALPHA:", "if False:",
           ("tests/test_serve.py::test_bad_input_gets_a_4xx_with_one_line_and_one_log_line",)),
    # --- A zero start vector (start_from_zero_embedding: Marian-NMT, CTranslate2) -----
    Mutant("the zero start embeds padding's row", MODEL,
           "embedded = jnp.where((decoder_inputs == 0)[..., None], 0, embedded)",
           "embedded = embedded",
           ("tests/test_model.py::test_start_from_zero_embedding_never_reads_row_0",)),
    Mutant("padding's logit keeps its row under a zero start", MODEL,
           "logits = jnp.where(jnp.arange(logits.shape[-1]) == 0, 0, logits)",
           "logits = logits",
           ("tests/test_model.py::test_start_from_zero_embedding_never_reads_row_0",)),
]


def copy_checkout(destination: Path) -> None:
  """The working tree's files that git knows or would add (uncommitted edits included)."""
  listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                           "--exclude-standard"], capture_output=True, check=True).stdout
  for name in filter(None, listed.decode().split("\0")):
    source = ROOT / name
    if source.is_file() and not name.startswith("results/"):
      target = destination / name
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(source, target)


def run_tests(checkout: Path, tests, timeout: int) -> tuple[str, float, str]:
  """(outcome: "passed", "failed", "timeout" or "error"; seconds; last lines of output) of
  pytest on `tests` inside `checkout`."""
  env = dict(os.environ, PYTHONPATH=str(checkout), MULTI30K_DIR=str(MULTI30K))
  start = time.perf_counter()
  try:
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             *tests], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=timeout)
    output = result.stdout + result.stderr
    summary = (result.stdout.strip().splitlines() or [""])[-1]  # "1 failed, 2 passed in 3.0s"
    if result.returncode == 0:
      outcome = "passed"
    elif result.returncode == 1 and re.search(r"\b\d+ failed\b", summary):
      outcome = "failed"  # Exit status 1 alone is also a fixture's error in setup.
    else:
      outcome = "error"
      output += f"\npytest exit status {result.returncode}"
  except subprocess.TimeoutExpired:
    outcome, output = "timeout", f"timed out after {timeout} s"
  lines = [line for line in output.strip().splitlines() if line.strip()]
  return outcome, time.perf_counter() - start, "\n".join(lines[-3:])


def run_mutant(checkout: Path, mutant: Mutant, timeout: int) -> tuple[str, float, str]:
  """Patches `checkout` with `mutant`, runs its tests there and restores the file:
  ("caught", "missed", "timeout" or "error", seconds, last lines of pytest's output)."""
  path = checkout / mutant.file
  original = path.read_text()
  path.write_text(original.replace(mutant.old, mutant.new))
  try:
    outcome, seconds, tail = run_tests(checkout, mutant.tests, timeout)
  finally:
    path.write_text(original)
  return {"passed": "missed", "failed": "caught"}.get(outcome, outcome), seconds, tail


def check_applies(mutant: Mutant, root: Path = ROOT) -> str | None:
  """None if the mutant's text occurs exactly once in its file, else the problem."""
  path = root / mutant.file
  if not path.is_file():
    return f"{mutant.name}: {mutant.file} does not exist"
  count = path.read_text().count(mutant.old)
  return None if count == 1 else f"{mutant.name}: its text occurs {count} times in {mutant.file}"


def main() -> int:
  flags = parser(__doc__)
  flags.set_defaults(json="results/bench/mutants.json")
  flags.add_argument("--only", nargs="*", default=None, help="mutant names to run")
  flags.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
  args = flags.parse_args()
  mutants = [m for m in MUTANTS if args.only is None or m.name in args.only]
  problems = [p for p in map(check_applies, mutants) if p]
  if problems:
    print("\n".join(problems))
    return 2

  from flax_transformer import provenance

  record = {"command": bench_command(),
            **provenance.describe(), "mutants": []}
  with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
    checkout = Path(scratch)
    copy_checkout(checkout)
    every_test = sorted({t for m in mutants for t in m.tests})
    outcome, seconds, tail = run_tests(checkout, every_test, args.timeout)
    passed = outcome == "passed"
    record["unmutated"] = {"tests": every_test, "passed": passed, "seconds": round(seconds, 1)}
    print(f"unmutated: {outcome} in {seconds:.0f} s")
    if not passed:
      print(tail)
      return 2
    print(f"{'mutant':62} {'result':7} {'s':>5}  tests")
    for mutant in mutants:
      outcome, seconds, tail = run_mutant(checkout, mutant, args.timeout)
      print(f"{mutant.name:62} {outcome:7} {seconds:5.0f}  {' '.join(mutant.tests)}", flush=True)
      record["mutants"].append({"name": mutant.name, "file": mutant.file, "old": mutant.old,
                                "new": mutant.new, "tests": list(mutant.tests),
                                "outcome": outcome, "seconds": round(seconds, 1),
                                "pytest_tail": tail})
  caught = sum(m["outcome"] == "caught" for m in record["mutants"])
  record["caught"], record["total"] = caught, len(record["mutants"])
  print(f"{caught} of {len(record['mutants'])} mutants caught")
  write_json(ROOT / args.json, record)
  return 0 if caught == len(record["mutants"]) else 1


if __name__ == "__main__":
  sys.exit(main())
