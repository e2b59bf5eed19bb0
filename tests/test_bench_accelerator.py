"""bench/accelerator.py in its tiny mode: every code path the accelerator run takes, on
the CPU, and the compilation cache hit by a second process."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_env

ROOT = Path(__file__).resolve().parents[1]

REQUIRED = ["device", "jax_version", "date", "readme_job_wall_s", "readme_job_decode_wall_s",
            "readme_job_test_bleu", "readme_job_ms_per_step", "train_step_compile_s_cold",
            "train_step_compile_s_warm", "base_bf16_mfu", "base_bf16_speedup_vs_peer",
            "decode_test2016_sentences_per_s", "decode_test2016_first_call_s",
            "init_compile_s_cold", "profile_trace_files", "decode_base_tokens_per_s_batch32",
            "decode_base_speedup_vs_peer_batch8", "decode_base_speedup_vs_peer_batch128"]


def bench_accelerator():
  """bench/accelerator.py as a module."""
  sys.path.insert(0, str(ROOT / "bench"))
  try:
    import accelerator
  finally:
    sys.path.remove(str(ROOT / "bench"))
  return accelerator


def test_tiny_run_measures_every_section_and_a_second_launch_loads_from_the_cache(
    tmp_path, multi30k_dir):
  out = tmp_path / "accelerator.json"
  env = cpu_env()  # One CPU device, as a plain run.
  result = subprocess.run(
      [sys.executable, str(ROOT / "bench/accelerator.py"), "--tiny", f"--data={multi30k_dir}",
       "--budget_s=3600",  # Every section must run: a loaded CI host must not skip one.
       f"--scratch={tmp_path / 'scratch'}", f"--out={out}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  record = json.loads(out.read_text())
  assert set(REQUIRED) <= set(record)
  # Without --peer_path only the peer comparisons are missing, each saying why.
  peer_free = [k for k in REQUIRED if "peer" not in k and k != "base_bf16_mfu"]
  assert all(record[k] is not None for k in peer_free), {k: record[k] for k in peer_free}
  assert set(record["errors"]) == {"base_bf16_peer", "decode_base_peer"}, record["errors"]
  assert all("--peer_path" in e for e in record["errors"].values())
  # Beam search at the base shape: tokens/s is the counted tokens over the median time,
  # and no best hypothesis is longer than the length bound.
  search = record["decode_base"]
  for batch, row in search["batches"].items():
    assert row["ours_tokens_per_s"] == pytest.approx(row["ours_tokens"] / row["ours_s_per_batch"])
    assert row["ours_s_per_batch"] == statistics.median(row["ours_runs_s"])
    assert 0 < row["ours_tokens"] <= int(batch) * search["max_decode_len"]
  # The relaunch wrote a profile trace (config.profile_steps) TensorBoard can open.
  assert any(name.endswith(".xplane.pb") for name in record["profile_trace_files"])

  # The second launch (same cache directory) loaded its steps instead of compiling them.
  cache = tmp_path / "scratch" / "cache"
  assert sum(1 for p in cache.iterdir() if p.is_file()) >= 5
  assert record["warm_compile_cache_hit"] is True
  warm_log = (tmp_path / "scratch" / "warm_train.log").read_text()
  assert "Train step for batch" in warm_log
  assert "loaded from the compilation cache in" in warm_log
  assert all(c["cached"] for c in record["warm_launch_compiles"])
  cold = [c for c in record["readme_job_compiles"] if c["what"] == "Train step"]
  assert len(cold) == 1 and not cold[0]["cached"]
  # Evaluation and BLEU compile at most config.eval_max_shapes (2 here) shapes each.
  assert 1 <= len(record["readme_job_eval_shapes"]) <= 2
  assert 1 <= len(record["readme_job_bleu_shapes"]) <= 2

  # The figures against what they are computed from: sacreBLEU on the decoded file, the
  # median of the steps the run logged, and the analytic count of the base step.
  import sacrebleu

  scratch = tmp_path / "scratch"
  hypotheses = (scratch / "readme_test.hyp").read_text().splitlines()
  references = (scratch / "test.ref").read_text().splitlines()
  # The tiny run decodes short sentences only: one batch shape, one search compile.
  tiny_count = bench_accelerator().TINY_TEST_SENTENCES
  assert len(hypotheses) == len(references) == record["decode_test2016_sentences"] == tiny_count
  assert len(record["decode_test2016_compile_s"]) == 1, record["decode_test2016_compile_s"]
  assert record["readme_job_test_bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
  logged = [json.loads(line) for line in (scratch / "readme" / "metrics.jsonl").read_text()
            .splitlines()]
  assert record["readme_job_steps"] == logged[-1]["step"] == 30
  assert record["readme_job_ms_per_step"] == pytest.approx(
      1000 * statistics.median(r["step_time_s"] for r in logged if "step_time_s" in r))
  assert record["decode_test2016_same_output_as_decode_py"] is True
  assert record["base_bf16"]["analytic_flops_per_step"] > 0

