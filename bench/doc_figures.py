"""Derived figures the docs quote: ratios, differences, ranges and medians over several
runs' files, each computed here from its files and formatted as the doc prints it.

A doc names one as `<!--{claim("ANCHOR", I)}-->TEXT<!--/-->` (bench/render_docs.py renders
and checks it): ANCHOR names the row (its first cells) or sentence (its start) of the
entry in ROWS, SENTENCES or LOGS below, I the figure's index in that entry. A figure
that is one value of one file needs no entry: the doc's template reads the file itself.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import render_docs

ROOT = Path(__file__).resolve().parents[1]



DECODE = "results/bench/decode_runs/2026-11-26/run{}.json"




def logged(step: int, key: str):
  """A metrics.jsonl figure: `key` of the record logged at `step`."""
  def pick(text):
    records = (json.loads(line) for line in text.splitlines() if line.strip())
    return next(r[key] for r in records if r.get("step") == step and key in r)
  return pick


BEST_DE = "results/runs/multi30k_en-de_best_config/"
RERUN = BEST_DE + "rerun_attempt_2026-11-27/"


def step_times(text: str) -> list[float]:
  """The step times (s) a metrics.jsonl logged, in order."""
  return [r["step_time_s"] for r in map(json.loads, filter(str.strip, text.splitlines()))
          if "step_time_s" in r]


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
BIASED = "results/runs/multi30k_en-de_biased_2026-11-26/readme_job_metrics.jsonl"
EXACT = "results/runs/multi30k_en-de_paper_exact/"
ROWS = [
    ("RESULTS.md", "loss at step 2000", BIASED, [(logged(2000, "eval_loss"), "{:.4f}")]),
    ("RESULTS.md", "loss at step 2000", EXACT + "metrics.jsonl",
     [(logged(2000, "eval_loss"), "{:.4f}")]),
    ("RESULTS.md", "BLEU at step 2000", BIASED, [(logged(2000, "bleu"), "{:.2f}")]),
    ("RESULTS.md", "BLEU at step 2000", EXACT + "metrics.jsonl",
     [(logged(2000, "bleu"), "{:.2f}")]),
] + [("RESULTS.md", "BLEU / chrF, last 5 averaged", EXACT + f"decode_validation_{name}.log",
      [SLASHED_SCORES]) for name in ("biased", "paper_exact")]


# (doc, sentence start, JSON, [(key path, format)]): the figures in the sentence's
# first 400 characters, in order.
SCORES = [("bleu", "{:.1f}"), ("bleu_lowercase", "{:.1f}"), ("chrf", "{:.1f}")]
SENTENCES = [
    ("RESULTS.md", "BLEU; the first EN->DE row's run, on an older",
     render_docs.run_json("multi30k_en-de_paper_exact"),
     [("train_wall_s", lambda s: f"{s / 60:.1f} minutes")]),
    ("RESULTS.md", "The decode the project reports (last 5 averaged)", EXACT + "paired_bs_validation.txt",
     [(p_values,
       lambda ps: f"p = {ps[0]:.2f} (BLEU) and {ps[1]:.2f} (chrF)")]),
    ("RESULTS.md", "The same file gives the resolution", EXACT + "paired_bs_validation.txt",
     [(lambda t: re.findall(r"\([\d.]+ ± ([\d.]+)\)", t),  # BLEU, chrF per system
       lambda ci: f"+-{ci[0]} and +-{ci[2]} BLEU")]),
    ("docs/provenance.md", "On validation (decode.py's default",
     EXACT + "decode_validation_biased.log",
     LABELLED_SCORES),
    ("docs/provenance.md", "On validation (decode.py's default",
     EXACT + "decode_validation_paper_exact.log",
     [SLASHED_SCORES]),
    ("docs/provenance.md", "On validation (decode.py's default", EXACT + "paired_bs_validation.txt",
     [(p_values,
       lambda ps: f"p = {ps[0]:.2f} and {ps[1]:.2f}")]),
    ("RESULTS.md", "Validation, last 10 averaged (`decode_validation.log`)",
     "results/runs/multi30k_en-de_best_config/decode_validation.log",
     LABELLED_SCORES),
] + [("RESULTS.md", "inside this run's own 95% bootstrap interval on test",
        f"results/runs/multi30k_{pair}_best_config/test_bleu_confidence.txt",
        [(lambda t: json.loads(t)["confidence"].split("= ")[1].replace("±", "+-"), "{}")])
       for pair in ("en-fr", "en-de")] + [
    ("docs/provenance.md", "the EN->FR one scored",
     render_docs.run_json("multi30k_en-fr_bpd0.02_7000steps"), SCORES),
    ("RESULTS.md", "Validation, last 5 averaged (`decode_validation.log`)",
     "results/runs/multi30k_en-fr_best_config/decode_validation.log",
     LABELLED_SCORES),
]


# Settings and figures in the prose of README and docs/, each against its config or file.
M30K, DEFAULT = "config:configs/multi30k.py", "config:configs/default.py"
SENTENCES += [
    ("README.md", "The main job trains", M30K,
     [("num_train_steps", "trains {} steps"), ("eval_every_steps", "every {} steps"),
      ("bleu_every_steps", "BLEU every {}")]),
    ("README.md", "The main job trains", render_docs.run_json("multi30k_en-de_paper_exact"),
     [("train_wall_s", lambda s: f"{s / 60:.1f} minutes of training")]),
    ("docs/provenance.md", "inside the one-command run's own 95% interval",
     "results/runs/multi30k_en-de_best_config/test_bleu_confidence.txt",
     [(lambda t: json.loads(t)["confidence"].split("± ")[1], "+-{}")]),
    ("docs/provenance.md", "the EN->FR one scored",
     "results/runs/multi30k_en-fr_best_config/test_bleu_confidence.txt",
     [(lambda t: json.loads(t)["confidence"].split("± ")[1], "inside +-{}")]),
    ("docs/training.md", "parameters placed by `config.logical_axis_rules`.", DEFAULT,
     [(lambda c: (c["adam_b1"], c["adam_b2"], c["adam_eps"]),
       lambda b: f"Adam({b[0]}, {b[1]}, {b[2]:.0e})".replace("e-0", "e-"))]),
    ("docs/provenance.md", "| LayerNorm epsilon |", DEFAULT,
     [("model.layer_norm_epsilon", lambda e: f"| {e:.0e} |".replace("e-0", "e-"))]),
    ("docs/provenance.md", "| Multi30k config |", M30K,
     [("model.d_model", "d_model {}"), ("model.d_ff", "d_ff {}"), ("model.num_heads", "{} heads"),
      (lambda c: (c["model"]["num_layers"], c["model"]["num_decoder_layers"] or
                  c["model"]["num_layers"]), lambda n: f"{n[0]}+{n[1]} layers"),
      ("vocab_size", lambda v: f"{v // 1000}k vocabulary"), ("warmup_steps", "warmup {}")]),
    ("docs/provenance.md", "runs the tests named for each on a copy", "results/bench/mutants.json",
     [(lambda r: (r["caught"], r["total"]), lambda c: f"{c[0]} of {c[1]} mutants caught"),
      (lambda r: r["unmutated"]["seconds"] + sum(m["seconds"] for m in r["mutants"]),
       lambda s: f"about {s / 60:.0f} minutes")]),
    ("RESULTS.md", "It was not re-run to the end",
     render_docs.run_json("multi30k_en-de_best_config"),
     [("train_wall_s", lambda s: f"{s / 60:.0f} minutes of both cores")]),
    ("RESULTS.md", "session's host ran the step in",
     (RERUN + "metrics.jsonl", BEST_DE + "metrics.jsonl", RERUN + "train.log"), [
        (lambda t: statistics.median(step_times(t[0])), "in {:.2f} s"),
        (lambda t: statistics.median(step_times(t[1])[:len(step_times(t[0]))]), "against {:.2f} s"),
        (lambda t: re.findall(r"ETA (\w+)", t[2])[-1], "ETA read {}"),
        (lambda t: (logged(500, "loss")(t[0]), logged(500, "loss")(t[1])),
         lambda x: f"{x[0]:.4f} here, {x[1]:.4f} there")]),
    ("README.md", "It simulates", "tests/conftest.py",
     [(lambda t: re.search(r"device_count=(\d+)", t).group(1), "simulates {} devices")]),
]

# (doc, sentence start, log file, regex with one group, format): a count or time the
# sentence quotes from a log (the test suite's count from CI's log).
# Figures that compare runs: the key function gets the records of every file named.
def results(*names):
  return tuple(render_docs.run_json(f"multi30k_{name}") for name in names)


def spread(records):
  bleus = [r["bleu"] for r in records]
  return max(bleus) - min(bleus)


SENTENCES += [
    ("RESULTS.md", "The decode the project reports (last 5 averaged) leans",
     (EXACT + "decode_validation_biased.log", EXACT + "decode_validation_paper_exact.log"),
     [(lambda logs: sacrebleu_line("BLEU")(logs[0]) - sacrebleu_line("BLEU")(logs[1]),
       "by {:.2f} BLEU")]),
    ("RESULTS.md", "for the second time a validation lead did not carry over",
     results("en-de_d03_6000steps", "en-de_6000steps", "en-de_4000steps"),
     [(spread, "within {:.1f} BLEU")]),
    ("RESULTS.md", "Against the same models at beam 4, alpha 0.6",
     results("en-de_bpd0.05_10000steps_b8_a1.4", "en-de_bpd0.05_10000steps",
             "en-de_bpd0.02_7000steps_b8_a1.4", "en-de_bpd0.02_7000steps",
             "en-fr_bpd0.02_7000steps_b4_a1.4", "en-fr_bpd0.02_7000steps"),
     [(lambda r: max(abs(r[i]["bleu"] - r[i + 1]["bleu"]) for i in (0, 2, 4)),
       "by more than {:.1f}")]),
    ("RESULTS.md", "Validation, last 10 averaged (`decode_validation.log`)",
     results("en-de_best_config", "en-de_bpd0.02_9000steps"),
     [(lambda r: r[1]["bleu"] - r[0]["bleu"], "scored {:.1f} BLEU below"),
     ]),
    ("RESULTS.md", "It trained alone in", results("en-de_best_config"),
     [("0.train_wall_s", lambda s: f"alone in {s / 60:.1f} minutes")]),
    ("RESULTS.md", "Validation, last 10 averaged (`decode_validation.log`)",
     EXACT + "paired_bs_validation.txt",
     [(lambda t: re.findall(r"\([\d.]+ ± ([\d.]+)\)", t),
       lambda ci: f"+-{ci[0]}-{ci[2]} BLEU")]),
    ("RESULTS.md", "Validation, last 5 averaged (`decode_validation.log`)",
     results("en-fr_best_config", "en-fr_bpd0.02_7000steps"),
     [(lambda r: r[1]["bleu"] - r[0]["bleu"], "scored {:.1f} BLEU below"),
     ]),
    ("RESULTS.md", "It trained in", results("en-fr_best_config"),
     [("0.train_wall_s", lambda s: f"trained in {s / 60:.1f} minutes")]),
]




def each(key):
  """A key path's value in each of several records."""
  return lambda records: [value(r, key) for r in records]


# The beam-search runs: medians over the five runs of each host, and the prose on them.
DECODE_23 = tuple(f"results/bench/decode_runs/decode_{run}.json" for run in range(1, 6))
DECODE_26 = tuple(DECODE.format(run) for run in range(1, 6))


SENTENCES += [
    ("BENCHMARKS.md", "Split over the two cores, ours is", DECODE_26, [
        (lambda rs: statistics.median(each("rows.1.s_per_batch")(rs))
         / statistics.median(each("rows.3.s_per_batch")(rs)), "{:.2f}x faster")]),
]


def search_step_mflop(config: dict, search: dict) -> tuple[float, float, float]:
  """Weight-matmul MFLOP of one beam-search step (2 FLOP per multiply-add) for the
  model of `config` and the batch and beam of a bench/decode.py record: logits, FFN,
  and per layer self-attention's four projections plus cross-attention's query and
  output ones (its keys and values are cached)."""
  model = config["model"]
  rows, d, layers = search["batch"] * search["beam_size"], model["d_model"], model["num_layers"]
  logits = 2 * rows * d * model["vocab_size"]
  ffn = layers * 2 * rows * 2 * d * model["d_ff"]
  attention = layers * 6 * 2 * rows * d * d
  return logits / 1e6, ffn / 1e6, attention / 1e6


# bench/decode.py's small model is configs/multi30k.py's shape; up to 63 steps a search.
STEP_COUNT = ("config:configs/multi30k.py", DECODE_23[4])
SENTENCES += [
    ("BENCHMARKS.md", "The bound, by count", STEP_COUNT, [
        (lambda r: sum(search_step_mflop(*r)), "need {:.0f} MFLOP"),
        (lambda r: search_step_mflop(*r)[0], "= {:.0f}, FFN"),
        (lambda r: search_step_mflop(*r)[1], "FFN {:.0f},"),
        (lambda r: search_step_mflop(*r)[2], "projections {:.0f})"),
        (lambda r: sum(search_step_mflop(*r)) * 63 / 1000, "{:.1f} GFLOP over")]),
]

SENTENCES += [
    ("BENCHMARKS.md", "The corpus (`bench/wmt_corpus.py`)", "results/bench/wmt_scale.json",
     [("pairs", lambda n: f"{n / 1e6:.1f}M EN-DE pairs")]),
    ("BENCHMARKS.md", "**Peak RSS <= 8 GB while training**", "results/bench/wmt_scale.json",
     [("stages.first_batch.train_pairs", lambda n: f"holds {n / 1e6:.1f}M pairs"),
      ("stages.first_batch.peak_rss_mb", lambda mb: f"about {mb / 1000:.0f} GB")]),
    ("BENCHMARKS.md", "n^2 term (per token", "results/bench/scaling.json",
     [(lambda r: next(p["ms_per_step"] for p in r["by_length"] if p["length"] == 64) / 1000,
       "({:.1f} s at 64"),
      (lambda r: next(p["ms_per_step"] for p in r["by_length"] if p["length"] == 512) / 1000,
       "-> {:.1f} s at 512")]),
]


def seconds(compiles, what: str):
  return [c["seconds"] for c in compiles if c["what"] == what]


ROUND2 = "results/device_runs/2026-11-27_h100_5ecb8c5/"
SENTENCES += [
    ("BENCHMARKS.md", "for the 8 input worker processes to start", ROUND2 + "accelerator.json", [
        (lambda r: seconds(r["readme_job_compiles"], "Train step")[0], "took {:.1f} s")]),
    ("BENCHMARKS.md", "**Tests on the GPU**", ROUND2 + "tests.log", [
        (lambda t: sum(map(int, re.search(r"(\d+) failed, (\d+) passed in", t).groups())),
         "ran {} tests")]),
    ("BENCHMARKS.md", "**Tests on the GPU**", ROUND2 + "tests_run3.log", [
        (lambda t: len(re.findall(r"^tests/\S+ PASSED", t, re.M)), "Run C: {} passed")]),
]

LOGS = [
    ("BENCHMARKS.md", "**Tests on the GPU**",
     "results/device_runs/2026-11-27_h100_5ecb8c5/tests.log", r"(\d+) passed in", "({} passed;"),
    ("README.md", "The suite (", "results/ci/2026-11-27_fresh_clone_285_2a158ac.log",
     r"(\d+) passed", "{} tests"),
    ("README.md", "The suite (", "results/ci/2026-11-27_fresh_clone_285_2a158ac.log",
     r"passed, \d+ warnings in ([\d.]+)s", lambda s: f"passed in {float(s) / 60:.1f} minutes"),
    ("README.md", "The suite (", "results/ci/2026-11-27_fresh_clone_285_2a158ac.log",
     r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\d+:[\d.]+)",
     lambda t: f"{int(t.split(':')[0]) + float(t.split(':')[1]) / 60:.1f} minutes with the venv"),
    ("README.md", "Before that issue's speed work", "results/ci/2026-11-27_fresh_clone_272_3ebf309.log",
     r"(\d+) passed", "passed {} tests"),
    ("README.md", "Before that issue's speed work", "results/ci/2026-11-27_fresh_clone_272_3ebf309.log",
     r"passed, \d+ warnings in ([\d.]+)s", lambda s: f"in {float(s) / 60:.1f} minutes"),
]


# (doc, text just before a fenced log block, file): every line of the block is quoted

def value(record, path):
  """The figure at a dotted key path ('rows.4.sentences_per_s'), or path(record)."""
  if callable(path):
    return path(record)
  for key in path.split("."):
    record = record[int(key)] if isinstance(record, list) else record[key]
  return record


def claim(root: Path, anchor: str, index: int) -> str:
  """The text of figure `index` of the entry named `anchor`, from its files."""
  def load(path):
    if isinstance(path, tuple):
      return [load(p) for p in path]
    if path.startswith("config:"):
      return render_docs.load_config(root, path[len("config:"):])
    text = (root / path).read_text()
    return json.loads(text) if path.endswith(".json") else text

  entries = [(path, key, fmt) for _, first, path, figures in ROWS + SENTENCES
             if first == anchor for key, fmt in figures]
  entries += [(path, lambda text, p=pattern: re.search(p, text).group(1), fmt)
              for _, first, path, pattern, fmt in LOGS if first == anchor]
  path, key, fmt = entries[index]
  x = value(load(path), key)
  return fmt(x) if callable(fmt) else fmt.format(x)
