"""Table 3 variants of the base model: `--config=configs/table3.py:ROW`.

Rows (paper name -> ROW): A h=1/4/16/32 -> A1, A4, A16, A32 (d_k = d_v =
d_model / h); B d_k=16/32 -> B16, B32; C N=2/4/8 -> C2, C4, C8; C d_model=256
/1024 -> C256, C1024 (d_k = d_v = d_model / 8); C d_ff=1024/4096 -> Cff1024,
Cff4096; D P_drop=0.0/0.2 -> Dp0, Dp2; D eps_ls=0.0/0.2 -> Dls0, Dls2;
E learned positions -> E; 'base' is the base row itself.
"""

from configs import default

ROWS = {
    "base": {},
    "A1": {"model.num_heads": 1},
    "A4": {"model.num_heads": 4},
    "A16": {"model.num_heads": 16},
    "A32": {"model.num_heads": 32},
    # Row B shrinks only the query/key width; values keep d_v = 64.
    "B16": {"model.d_k": 16, "model.d_v": 64},
    "B32": {"model.d_k": 32, "model.d_v": 64},
    "C2": {"model.num_layers": 2},
    "C4": {"model.num_layers": 4},
    "C8": {"model.num_layers": 8},
    "C256": {"model.d_model": 256},
    "C1024": {"model.d_model": 1024},
    "Cff1024": {"model.d_ff": 1024},
    "Cff4096": {"model.d_ff": 4096},
    "Dp0": {"model.dropout_rate": 0.0},
    "Dp2": {"model.dropout_rate": 0.2},
    "Dls0": {"label_smoothing": 0.0},
    "Dls2": {"label_smoothing": 0.2},
    "E": {"model.positional": "learned"},
}


def get_config(row: str = "base"):
  if row not in ROWS:
    raise ValueError(f"Unknown Table 3 row {row!r}; choose one of: {', '.join(ROWS)}")
  config = default.get_config()
  for dotted, value in ROWS[row].items():
    node = config
    *parents, leaf = dotted.split(".")
    for name in parents:
      node = node[name]
    node[leaf] = value
  return config
