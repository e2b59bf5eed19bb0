"""Train-step time and memory vs sequence length and vs batch size; a plot and a fit.

python bench/scaling.py [--json PATH] [--plot PATH] [--repeats 3]
bench/train_step.py's small model (vocab 8000, d_model 256, 3+3 layers, 4 heads, d_ff
1024), float32, one device. Memory is XLA's compiled temporary-buffer size for the step.
"""

from __future__ import annotations

import numpy as np

from common import machine, model_config, parser, print_table, random_ids, \
    run_like_entry_points, time_train_step, write_json
from train_step import SHAPES


def measure(rows: int, length: int, repeats: int) -> dict:
  small = SHAPES["small"]
  seconds, _, _, compiled = time_train_step(model_config(small, max_len=max(length, 64)),
                                            random_ids(small["vocab"], rows, length), repeats)
  memory = compiled.memory_analysis()
  temp_mb = getattr(memory, "temp_size_in_bytes", 0) / 2**20 if memory is not None else 0.0
  return {"rows": rows, "length": length, "tokens": 2 * rows * length,
          "ms_per_step": 1000 * seconds, "temp_mb": temp_mb}


def exponent(xs, ys) -> float:
  """Slope of log(y) against log(x): y ~ x^slope."""
  return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def main():
  flags = parser(__doc__)
  flags.add_argument("--plot", help="write the log-log plot here (PNG)")
  flags.add_argument("--repeats", type=int, default=3, help="timed steps per point (median)")
  args = flags.parse_args()
  run_like_entry_points()

  # Same tokens per batch (4096 per side) while the length grows: attention's
  # n^2 share shows as growth beyond the linear (matmul) part.
  by_length = [measure(max(1, 4096 // n), n, args.repeats) for n in (32, 64, 128, 256, 512)]
  by_batch = [measure(b, 64, args.repeats) for b in (8, 16, 32, 64)]
  print_table(by_length + by_batch, ["rows", "length", "tokens", "ms_per_step", "temp_mb"])
  fits = {
      "length_exponent_fixed_tokens": exponent([r["length"] for r in by_length],
                                               [r["ms_per_step"] for r in by_length]),
      "batch_exponent": exponent([r["rows"] for r in by_batch],
                                 [r["ms_per_step"] for r in by_batch]),
      "memory_length_exponent_fixed_tokens": exponent(
          [r["length"] for r in by_length], [max(r["temp_mb"], 1e-3) for r in by_length]),
  }
  print(fits)
  if args.plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].loglog([r["length"] for r in by_length], [r["ms_per_step"] for r in by_length],
                   "o-", label="ms/step (4096 tokens/side)")
    axes[0].loglog([r["length"] for r in by_length], [r["temp_mb"] for r in by_length], "s--",
                   label="XLA temp MB")
    axes[0].set_xlabel("sequence length")
    axes[0].legend()
    axes[1].loglog([r["rows"] for r in by_batch], [r["ms_per_step"] for r in by_batch], "o-",
                   label="ms/step (length 64)")
    axes[1].loglog([r["rows"] for r in by_batch], [r["temp_mb"] for r in by_batch], "s--",
                   label="XLA temp MB")
    axes[1].set_xlabel("batch rows")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=90)
    print(f"wrote {args.plot}")
  write_json(args.json, {"by_length": by_length, "by_batch": by_batch, **fits,
                         "machine": machine()})


if __name__ == "__main__":
  main()
