"""Loss and BLEU curves of training runs, from their logged metrics, as one PNG.

python -m tools.plot_curves --out results/runs/multi30k_en-de/curves_en-de.png WORKDIR [WORKDIR ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("workdirs", nargs="+", help="training workdirs (local or gs://, s3://)")
  parser.add_argument("--out", required=True, help="the PNG to write")
  args = parser.parse_args()

  import matplotlib

  from flax_transformer.training.metrics import read_metrics  # Local or bucket, every launch.

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(11, 4))
  for workdir in args.workdirs:
    records = read_metrics(workdir)
    name = Path(workdir).name
    minutes = [r["wall_s"] / 60 for r in records]
    loss_ax.plot(minutes, [r["loss"] for r in records], label=f"{name} train")
    evals = [r for r in records if "eval_loss" in r]
    loss_ax.plot([r["wall_s"] / 60 for r in evals], [r["eval_loss"] for r in evals], "o-",
                 label=f"{name} validation")
    for key, split in (("bleu", "validation"), ("test_bleu", "test")):
      bleus = [r for r in records if key in r]
      if bleus:
        bleu_ax.plot([r["wall_s"] / 60 for r in bleus], [r[key] for r in bleus], "o-",
                     label=f"{name} {split} BLEU")
  loss_ax.set_xlabel("wall time (min)")
  loss_ax.set_ylabel("label-smoothed loss")
  loss_ax.legend()
  bleu_ax.set_xlabel("wall time (min)")
  bleu_ax.set_ylabel("sacreBLEU (beam 4)")
  bleu_ax.legend()
  fig.tight_layout()
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(args.out, dpi=90)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
