"""Training step speed: this project vs torch nn.Transformer (the same arithmetic, under
torch.compile unless --torch_eager), against the matmul limit.

python bench/train_step.py [--config small|base|all] [--json PATH] [--repeats 7]
small: vocab 8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, batch 32 x 64.
base:  vocab 32000, the paper's base model, batch 8 x 64. float32, 1 device,
random ids (no padding), Adam, label smoothing 0.1, dropout 0.1.
"""

from __future__ import annotations

import importlib.metadata

from common import machine, matmul_peak_gflops, median, model_config, parser, peak_rss_mb, \
    print_table, random_ids, run_like_entry_points, time_train_step, timings, write_json

SHAPES = {
    "small": dict(vocab=8000, d_model=256, layers=3, heads=4, d_ff=1024, rows=32, length=64),
    "base": dict(vocab=32000, d_model=512, layers=6, heads=8, d_ff=2048, rows=8, length=64),
}


def jax_step(shape: dict, repeats: int) -> dict:
  batch = random_ids(shape["vocab"], shape["rows"], shape["length"])
  seconds, flops, compile_s, _ = time_train_step(model_config(shape), batch, repeats, warmup=2)
  tokens = 2 * shape["rows"] * shape["length"]
  return {"ms_per_step": 1000 * seconds, "tokens_per_s": tokens / seconds,
          "nonpad_tokens_per_s": tokens / seconds, "compile_s": compile_s,
          "flops_per_step": flops, "gflops_per_s": flops / seconds / 1e9}


def torch_step(shape: dict, repeats: int, compiled: bool = True) -> float:
  """ms/step of torch.nn.Transformer on our model's arithmetic: tied embeddings scaled
  by sqrt(d_model), the paper's sinusoids, dropout 0.1 on the embedding sums and in
  every sub-layer, post-LN, label smoothing 0.1, Adam; `compiled`: the loss under
  `torch.compile`, else eager (on the 2026-11-26 2-core host eager was the faster of
  the two: BENCHMARKS.md). The inputs have no padding, so
  padding masks would change no value; the causal mask is applied. nn.Transformer adds
  a final LayerNorm to its encoder and decoder (two more than ours).
  """
  import math

  import numpy as np
  import torch

  from flax_transformer.network.layers import sinusoidal_position_encoding

  torch.manual_seed(0)
  torch.set_num_threads(max(1, torch.get_num_threads()))
  d, v = shape["d_model"], shape["vocab"]
  embedding = torch.nn.Embedding(v, d)
  network = torch.nn.Transformer(d_model=d, nhead=shape["heads"],
                                 num_encoder_layers=shape["layers"],
                                 num_decoder_layers=shape["layers"],
                                 dim_feedforward=shape["d_ff"], dropout=0.1, batch_first=True)
  dropout = torch.nn.Dropout(0.1)
  params = list(embedding.parameters()) + list(network.parameters())
  optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
  rows, length = shape["rows"], shape["length"]
  src = torch.randint(2, v, (rows, length))
  tgt = torch.randint(2, v, (rows, length))
  causal = network.generate_square_subsequent_mask(length)
  positions = torch.from_numpy(np.asarray(sinusoidal_position_encoding(length, d),
                                          np.float32))
  scale = math.sqrt(d)

  def loss_of(src, tgt):
    source = dropout(embedding(src) * scale + positions)
    target = dropout(embedding(tgt) * scale + positions)
    out = network(source, target, tgt_mask=causal, tgt_is_causal=True)
    logits = out @ embedding.weight.T
    return loss_fn(logits.reshape(-1, v), tgt.reshape(-1))

  forward = torch.compile(loss_of) if compiled else loss_of

  def step():
    optimizer.zero_grad()
    forward(src, tgt).backward()
    optimizer.step()

  return 1000 * median(timings(step, repeats, warmup=3))


def main():
  flags = parser(__doc__)
  flags.add_argument("--config", default="all", choices=["small", "base", "all"])
  flags.add_argument("--repeats", type=int, default=7, help="timed steps (median reported)")
  flags.add_argument("--no_torch", action="store_true", help="skip the torch comparison")
  flags.add_argument("--torch_eager", action="store_true",
                     help="torch without torch.compile (the default compiles its step)")
  args = flags.parse_args()
  run_like_entry_points()

  names = list(SHAPES) if args.config == "all" else [args.config]
  peak = matmul_peak_gflops()
  rows = []
  for name in names:
    result = {"config": name, **jax_step(SHAPES[name], args.repeats)}
    result["matmul_peak_gflops_per_s"] = peak
    result["fraction_of_matmul_peak"] = result["gflops_per_s"] / peak
    # Before torch runs in this process: the peak is ours alone.
    result["peak_rss_mb"] = peak_rss_mb()
    if not args.no_torch:
      result["torch_ms_per_step"] = torch_step(SHAPES[name], args.repeats,
                                               compiled=not args.torch_eager)
      result["torch_compiled"] = not args.torch_eager
      result["torch_version"] = importlib.metadata.version("torch")
      result["speedup_vs_torch"] = result["torch_ms_per_step"] / result["ms_per_step"]
    rows.append(result)
  print_table(rows, ["config", "ms_per_step", "tokens_per_s", "gflops_per_s",
                     "fraction_of_matmul_peak", "compile_s", "torch_ms_per_step",
                     "speedup_vs_torch", "peak_rss_mb"])
  record = dict(rows[0]) if len(rows) == 1 else {"results": rows}
  write_json(args.json, {**record, "repeats": args.repeats, "machine": machine()})

if __name__ == "__main__":
  main()
