"""A projection, not a measurement: the paper's training runs at our measured step rates.

python bench/projection.py [--json results/bench/projection.json]

Inputs (all committed files):
- the base model's bf16 train step measured on one H200 and one H100 (bench/accelerator.py,
  192 x 128 tokens a side, vocabulary 32k);
- bench/wmt_scale.py's 4.5M-pair run: packed tokens per step at configs/base.py's batching
  and the input path's tokens/s per core.
Assumptions (stated in the JSON and in BENCHMARKS):
- a step's time scales with its analytic FLOPs (training/steps.py) at the measured MFU:
  from the measured shape to configs/base.py's (97 x 256 slots a side, 37k vocabulary) and
  to the big model's; larger matmuls usually run at a higher MFU, so the big model's figure
  leans pessimistic;
- eight GPUs split the paper's batch (about 25k tokens a side) eight ways, each at the
  one-GPU MFU, plus a ring all-reduce of float32 gradients at an assumed NCCL bus
  bandwidth; per-GPU batches of about 3k tokens usually run at a lower MFU, which would
  lengthen the eight-GPU figures: unmeasured here;
- evaluation, checkpoints and compiles are left out.
"""

from __future__ import annotations

import json

from common import ROOT, bench_command, parser, print_table, write_json

DEVICE_RUNS = {
    "H200": ("results/device_runs/2026-11-26_h200_f31bb47/base.json", "base_bf16"),
    "H100": ("results/device_runs/accelerator_nvidia-h100-80gb-hbm3.json", "base_bf16"),
}
WMT_SCALE = "results/bench/wmt_scale.json"
PAPER = {"base": {"steps": 100_000, "p100_hours": 12.0, "step_s": 0.4},
         "big": {"steps": 300_000, "p100_hours": 3.5 * 24, "step_s": 1.0}}
GPUS = 8
NCCL_BUS_GB_S = 350.0  # Assumed all-reduce bus bandwidth, 8 GPUs on NVLink (nccl-tests order).


def main():
  args = parser(__doc__).parse_args()

  from configs import base, big
  from flax_transformer.averaging import abstract_params
  from flax_transformer.network.model import count_params
  from flax_transformer.training.config_checks import model_config_from
  from flax_transformer.training.steps import train_step_flops

  scale = json.loads((ROOT / WMT_SCALE).read_text())["stages"]
  throughput = scale["throughput"]
  rows, length = throughput["batch_shape"]
  nonpad = throughput["by_workers"]["0"]["nonpad_fraction"]
  per_core = throughput["by_workers"]["0"]["tokens_per_s"]  # Both sides, one core.
  tokens_a_side = rows * length * nonpad

  rows_out, record = [], {"inputs": {}, "assumptions": {
      "same_mfu_as_measured": True, "gpus": GPUS, "nccl_bus_gb_s": NCCL_BUS_GB_S,
      "gradient_bytes_per_param": 4, "excluded": "evaluation, checkpoints, compiles"},
      "projections": []}
  for device, (path, key) in DEVICE_RUNS.items():
    measured = json.loads((ROOT / path).read_text())[key]
    shape = measured["shape"]
    measured_config = model_config_from(base.get_config()).replace(
        vocab_size=shape["vocab"], d_model=shape["d_model"], d_ff=shape["d_ff"],
        num_heads=shape["heads"])
    measured_flops = train_step_flops(measured_config, shape["rows"], shape["length"],
                                      shape["length"])
    seconds_per_flop = measured["ours_ms"] / 1e3 / measured_flops
    measured_tokens = GPUS * 2 * shape["rows"] * shape["length"] / (measured["ours_ms"] / 1e3)
    record["inputs"][device] = {"file": path, "ms": measured["ours_ms"], "shape": shape,
                                "mfu": measured["ours_mfu_of_bf16_peak"],
                                "input_cores_8_at_measured_shape": measured_tokens / per_core}
    for name, module in (("base", base), ("big", big)):
      config = module.get_config()
      model = model_config_from(config)
      flops = train_step_flops(model, rows, length, length)
      step_1 = flops * seconds_per_flop
      params = count_params(abstract_params(model))
      allreduce = 2 * (GPUS - 1) / GPUS * params * 4 / (NCCL_BUS_GB_S * 1e9)
      step_8 = step_1 / GPUS + allreduce
      steps = PAPER[name]["steps"]
      row = {"model": name, "device": device, "steps": steps,
             "step_ms_1": step_1 * 1e3, "hours_1": steps * step_1 / 3600,
             "step_ms_8": step_8 * 1e3, "allreduce_ms": allreduce * 1e3,
             "hours_8": steps * step_8 / 3600, "paper_hours_8_p100": PAPER[name]["p100_hours"],
             "speedup_8_vs_paper": PAPER[name]["p100_hours"] / (steps * step_8 / 3600),
             "parameters": params, "flops_per_step": flops,
             # The demanding case: each of 8 GPUs at its own full-batch step rate.
             "input_tokens_per_s_8": GPUS * 2 * tokens_a_side / step_1}
      row["input_cores_8"] = row["input_tokens_per_s_8"] / per_core
      rows_out.append(row)
  record["projections"] = rows_out
  record["inputs"]["wmt_scale"] = {"file": WMT_SCALE, "batch_shape": [rows, length],
                                   "nonpad_fraction": nonpad,
                                   "real_tokens_a_side_per_step": tokens_a_side,
                                   "input_tokens_per_s_per_core": per_core}
  record["tfds_registry"] = _registry()
  record["command"] = bench_command()
  print_table(rows_out, ["model", "device", "steps", "step_ms_1", "hours_1", "step_ms_8",
                         "hours_8", "paper_hours_8_p100", "speedup_8_vs_paper",
                         "input_cores_8"])
  write_json(args.json, record)


def _registry() -> dict:
  """URLs and bytes tfds registers for each WMT14 config we train on (no network)."""
  import tempfile

  from tensorflow_datasets.translate import wmt14

  from flax_transformer.data import wmt

  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    for name in ("de-en", "fr-en"):
      builder = wmt14.Wmt14Translate(config=name, data_dir=tmp)
      out[f"wmt14_translate/{name}"] = {"urls": wmt.archive_urls(builder),
                                        "download_bytes": wmt.download_size(builder)}
  return out


if __name__ == "__main__":
  main()
