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

REQUIRED = ["device", "jax_version", "date", "readme_job_wall_s", "readme_job_test_bleu",
            "readme_job_ms_per_step", "readme_job_ms_per_step_repeated_batch",
            "train_step_compile_s_cold", "train_step_compile_s_warm", "base_bf16_mfu",
            "base_bf16_speedup_vs_peer", "small_f32_speedup_vs_peer", "decode_compile_s",
            "decode_speedup_vs_peer", "decode_test2016_sentences_per_s", "init_compile_s_cold",
            "profile_trace_files", "threefry_kernel_same_bits", "decode_base_tokens_per_s_batch32",
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
  assert set(record["errors"]) == {"small_f32_peer", "base_bf16_peer", "decode_vs_peer_peer",
                                   "decode_base_peer"}, record["errors"]
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
  # median of the steps the run logged, and the analytic count of the small shape.
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
  # Here both decodes run on the CPU (one device, and the rest of the cores), so they
  # agree; the comparison itself is checked below on outputs that do not.
  assert record["decode_test2016_same_output_as_cpu"] is True
  assert record["decode_test2016_lines_differing_from_cpu"] == 0
  assert record["readme_step_fed_over_repeated"] > 0
  assert record["small_f32"]["analytic_flops_per_step"] > 0


def test_device_and_cpu_outputs_are_compared_line_by_line():
  accelerator = bench_accelerator()
  same = accelerator.compare_outputs(["ein Hund", "zwei Männer"], ["ein Hund", "zwei Männer"])
  assert same["decode_test2016_same_output_as_cpu"] is True
  one = accelerator.compare_outputs(["ein Hund", "zwei Männer"], ["ein Hund", "zwei Frauen"])
  assert one["decode_test2016_same_output_as_cpu"] is False
  assert one["decode_test2016_lines_differing_from_cpu"] == 1
  assert one["decode_test2016_first_differences"] == [
      {"line": 2, "device": "zwei Männer", "cpu": "zwei Frauen"}]
  short = accelerator.compare_outputs(["ein Hund"], ["ein Hund", "zwei Frauen"])
  assert short["decode_test2016_same_output_as_cpu"] is False
  assert short["decode_test2016_lines_differing_from_cpu"] == 1


def test_ablations_replace_existing_pieces_with_the_same_math():
  """Each ablation swaps a real attribute (a rename fails here, not silently on the
  device) for plain JAX giving our values: its timing compares like with like."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  accelerator = bench_accelerator()
  patches = accelerator.ablation_patches()
  assert set(patches["all_plain"]) == {k for name, p in patches.items() if name != "all_plain"
                                       for k in p}
  for (module, attr), replacement in patches["all_plain"].items():
    assert callable(getattr(module, attr)), f"{module.__name__}.{attr}"

  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
  embedding = jnp.asarray(rng.normal(size=(11, 8)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, (2, 3)))
  for (module, attr), plain in patches["all_plain"].items():
    ours = getattr(module, attr)
    if attr == "tied_projection":
      args, wrt = (x, embedding), (0, 1)
    elif attr == "smoothed_cross_entropy":
      args, wrt = (x @ embedding.T, targets, 0.1), (0,)
    else:  # Dropout masks: the same keep rate, not the same bits.
      key, shape = jax.random.PRNGKey(0), (64, 512)
      assert abs(float(ours(key, shape, 0.1).mean()) - 0.9) < 0.01
      assert abs(float(plain(key, shape, 0.1).mean()) - 0.9) < 0.01
      continue

    def total(fn, *a):
      out = fn(*a)
      return sum(jnp.sum(o * (i + 1)) for i, o in enumerate(jax.tree_util.tree_leaves(out)))

    np.testing.assert_allclose(total(plain, *args), total(ours, *args), rtol=1e-5)
    for g_plain, g_ours in zip(jax.grad(lambda *a: total(plain, *a), wrt)(*args),
                               jax.grad(lambda *a: total(ours, *a), wrt)(*args)):
      np.testing.assert_allclose(g_plain, g_ours, rtol=1e-4, atol=1e-5)
