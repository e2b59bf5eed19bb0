"""Checks the figures README.md, RESULTS.md and BENCHMARKS.md quote against the JSON
files they come from, so the docs cannot drift from the evidence.

python bench/check_docs.py [--root DIR]

Each claim names a doc, the table row (by the start of its first cell) or sentence
the figure sits in, the JSON file and how each figure is formatted from it. Exit 0
when every claim holds; 1 with one line per mismatch (doc, row, expected, found);
2 when a named JSON file or row is missing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100 = "results/accelerator_runs/2026-11-26_h100_run{}/{}.json"


def test_scores(minute_digits: int = 0):
  """A results/multi30k_*.json row: steps, train minutes, BLEU, lowercased, chrF."""
  return [("steps", "{:d}"), ("train_wall_s", lambda s: f"{s / 60:.{minute_digits}f} min"),
          ("bleu", "{:.1f}"), ("bleu_lowercase", "{:.1f}"), ("chrf", "{:.1f}")]


def step_row(section: str):
  """An accelerator variant's row: ours, peer, ratio, both compiles."""
  return [(f"{section}.ours_ms", "{:.2f}"), (f"{section}.peer_ms", "{:.2f}"),
          (f"{section}.speedup_vs_peer", "{:.2f}x"), (f"{section}.ours_compile_s", "{:.1f} s"),
          (f"{section}.peer_compile_s", "{:.1f} s")]


# (doc, first cell of the row, JSON, [(key path, format)]): the row's cells after the
# first must hold the formatted values in this order (other cells may sit between).
ROWS = [
    ("README.md", "EN->DE | `configs/multi30k.py`", "results/multi30k_en-de_paper_exact.json",
     test_scores()),
    ("README.md", "EN->DE | `configs/multi30k_best.py:en-de`",
     "results/multi30k_en-de_best_config.json", test_scores()),
    ("RESULTS.md", "EN->DE, `configs/multi30k_best.py:en-de` as is",
     "results/multi30k_en-de_best_config.json", test_scores(1)),
    ("README.md", "EN->DE | three runs voting", "results/multi30k_en-de_ensemble3.json",
     test_scores()),
    ("README.md", "EN->FR | `configs/multi30k_en_fr.py`",
     "results/multi30k_en-fr_paper_exact.json", test_scores()),
    ("RESULTS.md", "EN->FR, `configs/multi30k_en_fr.py` as is",
     "results/multi30k_en-fr_paper_exact.json", test_scores(1)),
    ("README.md", "EN->FR | `configs/multi30k_best.py:en-fr`",
     "results/multi30k_en-fr_best_config.json", test_scores()),
    ("RESULTS.md", "EN->FR, `configs/multi30k_best.py:en-fr` as is",
     "results/multi30k_en-fr_best_config.json", test_scores(1)),
    ("RESULTS.md", "EN->DE | 2001", "results/multi30k_en-de.json", test_scores(1)),
    ("RESULTS.md", "EN->FR | 2000", "results/multi30k_en-fr.json", test_scores(1)),
    ("RESULTS.md", "EN->DE, the README command, paper-exact projections",
     "results/multi30k_en-de_paper_exact.json", test_scores(1)),
    ("RESULTS.md", "EN->DE, the README command, projections with biases",
     "results/multi30k_en-de_biased_2026-11-26.json", test_scores(1)),
    ("RESULTS.md", "EN->DE, the same README command re-run from a fresh checkout",
     "results/multi30k_en-de_reproduced.json", test_scores(1)),
    ("RESULTS.md", "EN->DE, dropout 0.2 and BPE-dropout 0.02, 7000 steps",
     "results/multi30k_en-de_bpd0.02_7000steps.json", test_scores(1)),
    ("RESULTS.md", "EN->DE, the same run continued to 9000 steps",
     "results/multi30k_en-de_bpd0.02_9000steps.json", test_scores(1)),
    ("RESULTS.md", "EN->FR, the same run continued to 7000 steps",
     "results/multi30k_en-fr_bpd0.02_7000steps.json", test_scores(1)),
    ("BENCHMARKS.md", "XLA defaults | base bf16", H100.format(3, "default"),
     step_row("base_bf16") + [("base_bf16.ours_mfu_of_bf16_peak", "{:.1%}")]),
    ("BENCHMARKS.md", "`--xla_gpu_enable_triton_gemm=false` | base bf16",
     H100.format(4, "no_triton_gemm"),
     step_row("base_bf16") + [("base_bf16.ours_mfu_of_bf16_peak", "{:.1%}")]),
    ("BENCHMARKS.md", "XLA defaults | small f32", H100.format(4, "default"),
     step_row("small_f32")),
    ("BENCHMARKS.md", "`--xla_gpu_enable_command_buffer=", H100.format(3, "command_buffers"),
     step_row("small_f32")),
    ("BENCHMARKS.md", "`--xla_gpu_enable_triton_gemm=false` | small f32",
     H100.format(3, "no_triton_gemm"), step_row("small_f32")),
]

ROWS += [("RESULTS.md", first, f"results/{name}.json", test_scores(1)) for first, name in [
    ("EN->DE, tuned on validation: dropout 0.2, 3000 steps", "multi30k_en-de_dropout0.2"),
    ("EN->DE, control: dropout 0.1, 3000 steps", "multi30k_en-de_3000steps"),
    ("EN->DE, tuned further on validation: dropout 0.2, 4000 steps", "multi30k_en-de_4000steps"),
    ("the same 4000-step run re-trained", "multi30k_en-de_4000steps_b4_a1.4"),
    ("EN->DE, dropout 0.2 and label smoothing 0.2", "multi30k_en-de_ls0.2_4000steps"),
    ("EN->DE, dropout 0.2, 6000 steps", "multi30k_en-de_6000steps"),
    ("EN->DE, dropout 0.3, 6000 steps", "multi30k_en-de_d03_6000steps"),
    ("EN->DE, dropout 0.2 and BPE-dropout 0.05", "multi30k_en-de_bpd0.05_10000steps"),
    ("EN->FR, tuned on validation: dropout 0.2, 3000 steps", "multi30k_en-fr_dropout0.2"),
    ("EN->FR, tuned further on validation: dropout 0.2, 4000 steps", "multi30k_en-fr_4000steps"),
    ("EN->FR, dropout 0.2 and BPE-dropout 0.02, 4000 steps", "multi30k_en-fr_bpd0.02_4000steps"),
    ("EN->FR, the same run continued to 6000 steps", "multi30k_en-fr_bpd0.02_6000steps"),
]] + [("RESULTS.md", "EN->DE, ensemble of three", "results/multi30k_en-de_ensemble3.json",
       [("train_wall_s", lambda s: f"{s / 60:.1f} min (sum)"), ("bleu", "{:.1f}"),
        ("bleu_lowercase", "{:.1f}"), ("chrf", "{:.1f}")])]

TORCH = "results/train_step_runs/2026-11-26_torch_compiled/{}.json"
ROWS += [
    ("BENCHMARKS.md", f"{run} | {name}", TORCH.format(run),
     [(f"results.{index}.ms_per_step", "{:.0f}")]
     + ([] if run.startswith("eager") else
        [(f"results.{index}.fraction_of_matmul_peak", "{:.1%}")])
     + [(f"results.{index}.torch_ms_per_step", "{:.0f}"),
        (f"results.{index}.speedup_vs_torch", "{:.2f}x")])
    for index, name in enumerate(("small", "base"))
    for run in ("run1", "run2", "run3", "eager_run1", "eager_run2")]

DECODE = "results/decode_runs/2026-11-26/run{}.json"
ROWS += [("BENCHMARKS.md", f"{run} | {plain1:.3f}", DECODE.format(run), [
    ("rows.0.s_per_batch", "{:.3f}"), ("rows.1.s_per_batch", "{:.3f}"),
    ("rows.2.s_per_batch", "{:.3f}"), ("rows.3.s_per_batch", "{:.3f}"),
    ("speedup_vs_plain", "{:.2f}"), ("rows.4.sentences_per_s", "{:.1f}"),
    ("rows.5.sentences_per_s", "{:.1f}"),
    (lambda r: r["rows"][5]["sentences_per_s"] / r["rows"][4]["sentences_per_s"], "{:.2f}")])
    for run, plain1 in ((1, 0.699), (2, 0.831), (3, 0.817), (4, 0.813), (5, 0.826))]

ROWS += [("BENCHMARKS.md", f"{rows} | {length} | {rows * length * 2}", "results/scaling.json",
          [(f"{part}.{i}.ms_per_step", "{:.0f}"), (f"{part}.{i}.temp_mb", "{:.0f}")])
         for part, shapes in (("by_length", ((128, 32), (64, 64), (32, 128), (16, 256),
                                             (8, 512))),
                              ("by_batch", ((8, 64), (16, 64), (32, 64))))
         for i, (rows, length) in enumerate(shapes)]
ROWS += [("BENCHMARKS.md", "220,276", "results/input_pipeline.json",
          [("nonpad_fraction", "{:.3f}"), ("batch_tokens", "{:d}"),
           ("train_tokens_per_s", "{:,.0f} tokens/s"), ("ratio_to_training", "{:.0f}x")])]

ROWS += [("RESULTS.md", f"{step} | ", "results/multi30k_en-de.json",
          [(f"validation_bleu_curve.{i}.1", lambda s: f"{s / 60:.1f} min"),
           (f"validation_bleu_curve.{i}.2", "{:.2f}")])
         for i, step in enumerate((400, 800, 1200, 1600, 2000))]



def curve(steps, what: str = "bleu"):
  """A by-step validation row from a results JSON's `validation_bleu_curve` ([step,
  wall s, BLEU] per BLEU evaluation): BLEU to one decimal, or wall time in minutes."""
  def at(step):
    def pick(record):
      point = next(p for p in record["validation_bleu_curve"] if p[0] == step)
      return point[2] if what == "bleu" else point[1] / 60
    return pick
  # The curve holds BLEU to 0.01 and wall time to 1 s, the tables one decimal of the
  # unrounded figure: a value on a rounding boundary (39.65) admits both neighbours.
  source_step = 0.01 if what == "bleu" else 1 / 60
  def one_decimal(x):
    return tuple(dict.fromkeys(f"{x + d:.1f}" for d in (-source_step / 2, 0, source_step / 2)))
  return [(at(step), one_decimal) for step in steps]


EVERY_400 = lambda last: range(400, last + 1, 400)  # noqa: E731
TUNING = "## Tuning on validation (EN->DE) >> "
LONGER = "### Longer still: dropout 0.2, 4000 steps (EN->DE) >> "
BPD02 = "### BPE-dropout 0.02 for EN->DE, 5000, 7000 and 9000 steps (2026-11-26) >> "
FR_TUNING = "## Tuning on validation (EN->FR) >> "
# (doc, first cell, JSON name, steps, what): RESULTS' by-step validation tables.
CURVES = [
    (TUNING + "dropout 0.1 (2000 steps)", "en-de", (400, 800, 1200, 1600, 2000), "bleu"),
    (TUNING + "dropout 0.2 (3000 steps)", "en-de_dropout0.2",
     (*EVERY_400(2800), 3000), "bleu"),
    (TUNING + "control: dropout 0.1 (3000 steps)", "en-de_3000steps",
     (*EVERY_400(2800), 3000), "bleu"),
    (LONGER + "validation BLEU", "en-de_4000steps", EVERY_400(4000), "bleu"),
    ("### Longer still: dropout 0.2, 6000 steps >> validation BLEU (one checkpoint)",
     "en-de_6000steps", (4000, 4400, 4800, 5200, 5600, 6000), "bleu"),
    ("### Dropout 0.3 (EN->DE) >> wall time (min)", "en-de_d03_6000steps",
     range(1000, 6001, 1000), "wall"),
    ("### Dropout 0.3 (EN->DE) >> validation BLEU (one checkpoint)", "en-de_d03_6000steps",
     range(1000, 6001, 1000), "bleu"),
    ("### Label smoothing 0.2 >> label smoothing 0.1", "en-de_4000steps", EVERY_400(4000),
     "bleu"),
    ("### Label smoothing 0.2 >> label smoothing 0.2", "en-de_ls0.2_4000steps",
     EVERY_400(4000), "bleu"),
    ("### Subword regularisation (BPE-dropout) >> BPE-dropout 0.05: validation BLEU",
     "en-de_bpd0.05_10000steps", range(1000, 10001, 1000), "bleu"),
    ("### Subword regularisation (BPE-dropout) >> BPE-dropout 0.05: wall time (min)",
     "en-de_bpd0.05_10000steps", range(1000, 10001, 1000), "wall"),
    (BPD02 + "BPE-dropout 0.02: validation BLEU", "en-de_bpd0.02_9000steps",
     range(1000, 9001, 1000), "bleu"),
    (BPD02 + "BPE-dropout 0.02: wall time (min)", "en-de_bpd0.02_9000steps",
     range(1000, 9001, 1000), "wall"),
    (FR_TUNING + "dropout 0.1 (2000 steps)", "en-fr", EVERY_400(2000), "bleu"),
    (FR_TUNING + "dropout 0.2 (3000 steps)", "en-fr_dropout0.2", (*EVERY_400(2800), 3000),
     "bleu"),
    ("### Longer still: dropout 0.2, 4000 steps (EN->FR) >> validation BLEU",
     "en-fr_4000steps", EVERY_400(4000), "bleu"),
    ("### The EN->DE recipe as one command >> one command: validation BLEU", "en-de_best_config",
     range(1000, 9001, 1000), "bleu"),
    ("### The EN->DE recipe as one command >> one command: wall time (min)", "en-de_best_config",
     range(1000, 9001, 1000), "wall"),
    ("### The EN->FR recipe as one command >> one command: validation BLEU", "en-fr_best_config",
     range(1000, 7001, 1000), "bleu"),
    ("### The EN->FR recipe as one command >> one command: wall time (min)", "en-fr_best_config",
     range(1000, 7001, 1000), "wall"),
    ("### Subword regularisation for EN->FR >> BPE-dropout 0.02: validation BLEU",
     "en-fr_bpd0.02_7000steps", range(1000, 7001, 1000), "bleu"),
    ("### Subword regularisation for EN->FR >> BPE-dropout 0.02: wall time (min)",
     "en-fr_bpd0.02_7000steps", range(1000, 7001, 1000), "wall"),
]
ROWS += [("RESULTS.md", first, f"results/multi30k_{name}.json", curve(steps, what))
         for first, name, steps, what in CURVES]

ROWS += [("RESULTS.md", first, f"results/multi30k_{name}.json",
          [("bleu", "{:.1f}"), ("bleu_lowercase", "{:.1f}"), ("chrf", "{:.1f}")])
         for first, name in [
             ("EN->DE BPE-dropout 0.05, 10000 steps, beam 8", "en-de_bpd0.05_10000steps_b8_a1.4"),
             ("EN->DE BPE-dropout 0.02, 7000 steps, beam 8", "en-de_bpd0.02_7000steps_b8_a1.4"),
             ("EN->FR BPE-dropout 0.02, 7000 steps, beam 4", "en-fr_bpd0.02_7000steps_b4_a1.4")]]



def logged(step: int, key: str):
  """A metrics.jsonl figure: `key` of the record logged at `step`."""
  def pick(text):
    records = (json.loads(line) for line in text.splitlines() if line.strip())
    return next(r[key] for r in records if r.get("step") == step and key in r)
  return pick


def sacrebleu_line(metric: str):
  """The score of a decode log's sacreBLEU line ('BLEU = 38.78  (...)')."""
  return lambda text: float(re.search(rf"^{metric} = ([\d.]+)", text, re.M).group(1))


def bleu_and_chrf(text):
  """(BLEU, chrF) of a decode log."""
  return sacrebleu_line("BLEU")(text), sacrebleu_line("CHRF")(text)


def p_values(text):
  """sacreBLEU paired bootstrap output's p-values, in order (BLEU, then chrF)."""
  return [float(p) for p in re.findall(r"p = ([\d.]+)", text)]


# A decode log's scores as a sentence quotes them ("41.76 BLEU / 64.12 chrF").
LABELLED_SCORES = [(sacrebleu_line("BLEU"), "{:.2f} BLEU"), (sacrebleu_line("CHRF"), "{:.2f} chrF")]
SLASHED_SCORES = (bleu_and_chrf, lambda x: f"{x[0]:.2f} / {x[1]:.2f}")


# Text files (not JSON) are passed to the key functions whole.
BIASED = "results/behaviour_2026-11-26/readme_job_metrics.jsonl"
EXACT = "results/readme_job_2026-11-26_paper_exact/"
ROWS += [
    ("RESULTS.md", "loss at step 2000", BIASED, [(logged(2000, "eval_loss"), "{:.4f}")]),
    ("RESULTS.md", "loss at step 2000", EXACT + "metrics.jsonl",
     [(logged(2000, "eval_loss"), "{:.4f}")]),
    ("RESULTS.md", "BLEU at step 2000", BIASED, [(logged(2000, "bleu"), "{:.2f}")]),
    ("RESULTS.md", "BLEU at step 2000", EXACT + "metrics.jsonl",
     [(logged(2000, "bleu"), "{:.2f}")]),
] + [("RESULTS.md", "BLEU / chrF, last 5 averaged", EXACT + f"decode_validation_{name}.log",
      [SLASHED_SCORES]) for name in ("biased", "paper_exact")]

# The train-step tables of the 2026-11-23 and 2026-11-24 hosts: one row per run and
# config, from the run's tuned-malloc JSON and the system-malloc run beside it.
STEP_RUNS = {"Five runs on the 2026-11-23 host": "results/train_step_runs/{}_{}.json",
             "Five runs on the 2026-11-24 host": "results/train_step_runs/2026-11-24/{}_{}.json"}
ROWS += [("BENCHMARKS.md", f"{anchor} >> {config} | {run}", files.format("tuned_malloc", run), [
    (f"results.{index}.ms_per_step", "{:.0f}"), (f"results.{index}.tokens_per_s", "{:.0f}"),
    (f"results.{index}.gflops_per_s", "{:.0f}"),
    (f"results.{index}.matmul_peak_gflops_per_s", "{:.0f}"),
    (f"results.{index}.fraction_of_matmul_peak", "{:.0%}"),
    (f"results.{index}.compile_s", "{:.1f}"), (f"results.{index}.torch_ms_per_step", "{:.0f}"),
    (f"results.{index}.speedup_vs_torch", "{:.2f}")]) for anchor, files in STEP_RUNS.items()
    for index, config in enumerate(("small", "base")) for run in range(1, 6)]
ROWS += [("BENCHMARKS.md", f"{anchor} >> {config} | {run}", files.format("system_malloc", run),
          [(f"results.{index}.ms_per_step", "{:.0f}")])
         for anchor, files in STEP_RUNS.items()
         for index, config in enumerate(("small", "base")) for run in range(1, 6)]

# The 2026-11-23 beam-search runs: plain cached, ours, ratio.
ROWS += [("BENCHMARKS.md", f"2026-11-23 | {run}", f"results/decode_runs/decode_{run}.json",
          [("plain_s_per_batch", "{:.3f}"), ("s_per_batch", "{:.3f}"),
           ("speedup_vs_plain", "{:.2f}")]) for run in range(1, 6)]

CPU_ABLATIONS = "results/accelerator_runs/2026-11-26_cpu_ablations/accelerator.json"
ROWS += [("BENCHMARKS.md", "ours (hand-written pieces)", CPU_ABLATIONS,
          [("small_f32_with_ablations.ours_ms", "{:.1f}")])] + [
    ("BENCHMARKS.md", name, CPU_ABLATIONS,
     [(f"small_f32_ablations.{name}.ms", "{:.1f}"),
      (f"small_f32_ablations.{name}.over_ours", "{:.2f}")])
    for name in ("plain_tied_projection", "autodiff_cross_entropy", "bernoulli_dropout",
                 "all_plain")]

# (doc, sentence start, JSON, [(key path, format)]): the figures in the sentence's
# first 400 characters, in order.
SCORES = [("bleu", "{:.1f}"), ("bleu_lowercase", "{:.1f}"), ("chrf", "{:.1f}")]
SENTENCES = [
    ("BENCHMARKS.md", "Fits (log-log slope): step time vs batch", "results/scaling.json",
     [("batch_exponent", "**{:.2f}**"), ("length_exponent_fixed_tokens", "**{:.2f}**"),
      ("memory_length_exponent_fixed_tokens", "memory **{:.2f}**")]),
    ("RESULTS.md", "Its validation curve (", "results/multi30k_en-de_reproduced.json",
     [(f"validation_bleu_curve.{i}.2", "{:.2f}") for i in range(5)]),
    ("RESULTS.md", "BLEU; the first EN->DE row's run, on an older",
     "results/multi30k_en-de_paper_exact.json",
     [("train_wall_s", lambda s: f"{s / 60:.1f} minutes")]),
    ("RESULTS.md", "The decode the project reports (last 5 averaged)", EXACT + "paired_bs_validation.txt",
     [(p_values,
       lambda ps: f"p = {ps[0]:.2f} (BLEU) and {ps[1]:.2f} (chrF)")]),
    ("RESULTS.md", "The same file gives the resolution", EXACT + "paired_bs_validation.txt",
     [(lambda t: re.findall(r"\([\d.]+ ± ([\d.]+)\)", t),  # BLEU, chrF per system
       lambda ci: f"+-{ci[0]} and +-{ci[2]} BLEU")]),
    ("README.md", "On validation (decode.py's default", EXACT + "decode_validation_biased.log",
     LABELLED_SCORES),
    ("README.md", "On validation (decode.py's default", EXACT + "decode_validation_paper_exact.log",
     [SLASHED_SCORES]),
    ("README.md", "On validation (decode.py's default", EXACT + "paired_bs_validation.txt",
     [(p_values,
       lambda ps: f"p = {ps[0]:.2f} and {ps[1]:.2f}")]),
    ("BENCHMARKS.md", "README job end to end (2000 steps", H100.format(1, "accelerator"),
     [(lambda r: (r["readme_job_wall_s"], r["readme_job_train_wall_s"],
                  r["readme_job_decode_wall_s"]),
       lambda w: f"{w[0]:.0f} s ({w[1]:.0f} s train + {w[2]:.0f} s decode)")]),
    ("BENCHMARKS.md", "README job end to end (2000 steps", H100.format(2, "accelerator"),
     [(lambda r: (r["readme_job_wall_s"], r["readme_job_train_wall_s"],
                  r["readme_job_decode_wall_s"]),
       lambda w: f"{w[0]:.0f} s ({w[1]:.0f} + {w[2]:.0f};")]),
] + [("BENCHMARKS.md", "its test BLEU within 0.5 of the CPU run", H100.format(run, "accelerator"),
      [(lambda r: (r["readme_job_test_bleu"], r["readme_job_test_bleu_lowercased"]),
        lambda b: f"{b[0]:.1f} / {b[1]:.1f} lowercased")]) for run in (1, 2)] + [
    ("BENCHMARKS.md", start, H100.format(run, "accelerator"), [(key, fmt)])
    for start, key, fmt, runs in [
        ("train step cold compile <= 30 s |", "train_step_compile_s_cold", "{:.1f} s", (1, 2)),
        ("second launch <= 5 s |", "train_step_compile_s_warm", "{:.1f} s", (1, 2)),
        ("README job <= 10 ms/step |", "readme_job_ms_per_step", "{:.1f} ms", (1, 2)),
        ("test 2016 decode speed |", "decode_test2016_sentences_per_s", "{:,.0f} sentences/s",
         (1,)),
        ("beam search compile <= 20 s per shape |", "decode_compile_s", "{:.1f} s at 8 x 32",
         (1,))]
    for run in runs] + [
    ("BENCHMARKS.md", "within 1.25x of the step fed one batch", H100.format(2, "accelerator"),
     [(lambda r: (r["readme_job_ms_per_step"], r["readme_job_ms_per_step_repeated_batch"],
                  r["readme_step_ms_fed"]),
       lambda m: f"job {m[0]:.1f} / {m[1]:.1f} = {m[0] / m[1]:.2f}x; in-process, 8 workers: "
                 f"{m[2]:.1f} / {m[1]:.1f} = {m[2] / m[1]:.2f}x")]),
    ("BENCHMARKS.md", "small f32 (32 x 64) >= 1.3x the peer |", H100.format(1, "accelerator"),
     [(lambda r: r["small_f32"], lambda x: f"ours {x['ours_ms']:.2f} ms, peer {x['peer_ms']:.2f} "
       f"ms: {x['speedup_vs_peer']:.2f}x; compile {x['ours_compile_s']:.1f} s vs "
       f"{x['peer_compile_s']:.1f} s")]),
    ("BENCHMARKS.md", "small f32 (32 x 64) >= 1.3x the peer |", H100.format(3, "no_triton_gemm"),
     [(lambda r: r["small_f32"],
       lambda x: f"{x['ours_ms']:.2f} vs {x['peer_ms']:.2f} ms: {x['speedup_vs_peer']:.2f}x")]),
    ("BENCHMARKS.md", "beam search >= 2x the peer (8 x 32", H100.format(1, "accelerator"),
     [(lambda r: r["decode_vs_peer"],
       lambda x: f"ours {x['ours_s_per_batch'] * 1000:.1f} ms, peer "
                 f"{x['peer_s_per_batch'] * 1000:.1f} ms per batch: {x['speedup_vs_peer']:.2f}x "
                 f"({x['ours_sentences_per_s']:.0f} vs {x['peer_sentences_per_s']:.0f} "
                 "sentences/s)")]),
    ("BENCHMARKS.md", "test 2016, 1000 sentences, same output as on the CPU |",
     H100.format(1, "accelerator"),
     [("decode_test2016_lines_differing_from_cpu", lambda n: f"{1000 - n} of 1000 lines")]),
] + [("BENCHMARKS.md", "base bf16, ~25k tokens a side (192 x 128)", H100.format(run, name),
      [(lambda r: r["base_bf16"], lambda x: f"{x['ours_ms']:.1f} ms/step, "
        f"{x['ours_mfu_of_bf16_peak']:.1%} MFU, {x['speedup_vs_peer']:.2f}x the peer")])
     for run, name in ((3, "default"), (4, "no_triton_gemm"))] + [
    ("RESULTS.md", "Validation, last 10 averaged (`decode_validation.log`)",
     "results/best_en-de_2026-11-26/decode_validation.log",
     LABELLED_SCORES),
] + [("RESULTS.md", "inside this run's own 95% bootstrap interval on test",
        f"results/best_{pair}_2026-11-26/test_bleu_confidence.txt",
        [(lambda t: json.loads(t)["confidence"].split("= ")[1].replace("±", "+-"), "{}")])
       for pair in ("en-fr", "en-de")] + [
    ("README.md", "The EN->DE run the recipe was chosen from",
     "results/multi30k_en-de_bpd0.02_9000steps.json", SCORES),
    ("README.md", "(RESULTS.md); the EN->FR one scored",
     "results/multi30k_en-fr_bpd0.02_7000steps.json", SCORES),
    ("RESULTS.md", "Validation, last 5 averaged (`decode_validation.log`)",
     "results/best_en-fr_2026-11-26/decode_validation.log",
     LABELLED_SCORES),
    ("README.md", "The same command with the biases the projections had before",
     "results/multi30k_en-de_biased_2026-11-26.json", SCORES),
    ("README.md", "its aims are): the 2000 steps ran at", H100.format(2, "accelerator"),
     [("readme_job_ms_per_step", "{:.1f} ms/step"),
      ("readme_job_ms_per_step_repeated_batch", "({:.1f} ms"),
      ("train_step_compile_s_cold", "compiled in {:.0f} s"),
      ("train_step_compile_s_warm", "loaded in {:.1f} s"),
      ("readme_job_test_bleu", "{:.1f}")]),
    ("README.md", "its aims are): the 2000 steps ran at", H100.format(1, "accelerator"),
     [("readme_job_test_bleu", "scored {:.1f}")]),
    ("README.md", "The paper's base model in bf16 (192 x 128 tokens a side) then ran at",
     H100.format(4, "no_triton_gemm"),
     [("base_bf16.ours_ms", "{:.1f} ms/step"), ("base_bf16.ours_mfu_of_bf16_peak", "{:.0%} MFU"),
      ("base_bf16.speedup_vs_peer", "{:.2f}x")]),
]


# (doc, sentence start, log file, regex with one group, format): a count or time the
# sentence quotes from a log (the test suite's count from CI's log).
LOGS = [
    ("README.md", "The suite (", "results/ci/2026-11-26_fresh_clone_156.log",
     r"(\d+) passed", "{} tests"),
    ("README.md", "The suite (", "results/ci/2026-11-26_fresh_clone_156.log",
     r"passed, \d+ warnings in ([\d.]+)s", lambda s: f"passed in {float(s) / 60:.1f} minutes"),
]


def value(record, path):
  """The figure at a dotted key path ('rows.4.sentences_per_s'), or path(record)."""
  if callable(path):
    return path(record)
  for key in path.split("."):
    record = record[int(key)] if isinstance(record, list) else record[key]
  return record


def render(fmt, x) -> str:
  return fmt(x) if callable(fmt) else fmt.format(x)


def find_row(text: str, first_cell: str) -> list[str] | None:
  """The cells of the first table row starting first_cell; "ANCHOR >> cell" looks only
  after ANCHOR's first occurrence (tables whose rows share a first cell)."""
  *anchors, first_cell = first_cell.split(" >> ")
  for anchor in anchors:
    at = text.find(anchor)
    if at < 0:
      return None
    text = text[at:]
  for line in text.splitlines():
    cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
    if line.lstrip().startswith("|") and " | ".join(cells).startswith(first_cell):
      return cells
  return None


def check(root: Path) -> tuple[list[str], list[str]]:
  """(mismatches, missing): one line each."""
  mismatches, missing, docs = [], [], {}

  def doc(name):
    if name not in docs:
      docs[name] = (root / name).read_text()
    return docs[name]

  def load(path):
    try:
      text = (root / path).read_text()
      return json.loads(text) if path.endswith(".json") else text
    except (OSError, json.JSONDecodeError) as e:
      missing.append(f"{path}: {e}")
      return None

  for name, first, path, figures in ROWS:
    record, cells = load(path), find_row(doc(name), first)
    if record is None:
      continue
    if cells is None:
      missing.append(f"{name}: no table row starting {first!r}")
      continue
    rest = cells[1:]
    for key, fmt in figures:
      expected = render(fmt, value(record, key))
      accepted = expected if isinstance(expected, tuple) else (expected,)
      hit = next((i for i, c in enumerate(rest) if c in accepted), None)
      if hit is None:
        key = key if isinstance(key, str) else "a ratio"
        mismatches.append(f"{name}: row {first!r}: {key} from {path} is {expected!r}; "
                          f"row has {' | '.join(rest)}")
      else:
        rest = rest[hit + 1:]
  for name, start, path, figures in SENTENCES:
    record, text = load(path), " ".join(doc(name).split())
    if record is None:
      continue
    at = text.find(start)
    if at < 0:
      missing.append(f"{name}: no sentence starting {start!r}")
      continue
    window = text[at:at + 400]
    for key, fmt in figures:
      expected = render(fmt, value(record, key))
      if expected not in window:
        key = key if isinstance(key, str) else "a ratio"
        mismatches.append(f"{name}: {start!r}...: {key} from {path} is {expected!r}, not "
                          "in the sentence")
  for name, start, path, pattern, fmt in LOGS:
    text = " ".join(doc(name).split())
    at = text.find(start)
    try:
      match = re.search(pattern, (root / path).read_text())
    except OSError as e:
      missing.append(f"{path}: {e}")
      continue
    if at < 0 or match is None:
      missing.append(f"{name}: no sentence starting {start!r}" if at < 0
                     else f"{path}: no match for {pattern!r}")
      continue
    expected = render(fmt, match.group(1))
    if expected not in text[at:at + 400]:
      mismatches.append(f"{name}: {start!r}...: {path} says {expected!r}, not in the sentence")
  return mismatches, missing


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", default=str(ROOT), help="the repository to check")
  args = parser.parse_args()
  mismatches, missing = check(Path(args.root))
  for line in missing + mismatches:
    print(line)
  checked = sum(len(f) for *_, f in ROWS) + sum(len(f) for *_, f in SENTENCES) + len(LOGS)
  print(f"{checked} figures in {len(ROWS)} rows and {len(SENTENCES) + len(LOGS)} sentences: "
        f"{len(mismatches)} mismatched, {len(missing)} missing")
  return 2 if missing else 1 if mismatches else 0


if __name__ == "__main__":
  sys.exit(main())
