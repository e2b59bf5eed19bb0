"""The package's import graph, read from the source (imports inside functions too):
no cycles, arrows only downwards, and the house rules between its parts."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flax_transformer"

# Every module's layer; a module may import its own layer's and lower layers' modules.
LAYERS = {
    "errors": 0,
    # The network.
    "config": 1, "attention": 1, "layers": 1, "model": 1,
    # Search (model-agnostic).
    "decoding": 1,
    # Data.
    "tokenizer": 2, "sources": 2, "data": 2,
    # Training: steps, sharding, checkpoints, metrics, compiling.
    "sharding": 3, "training": 3, "checkpoints": 3, "metrics": 3, "compilation": 3,
    "host_allocator": 3,
    # The workdir format.
    "workdir": 4,
    # Translation.
    "batching": 5, "translator": 5, "attention_plot": 5,
    # The training loop, then the command lines.
    "loop": 6,
    "cli": 7, "decode_cli": 7,
    "__init__": 8,
}
NETWORK = {"config", "attention", "layers", "model"}


def imports_of(path: Path) -> set[str]:
  """Package modules `path` imports, at any depth (module top or inside functions)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      if node.module == "flax_transformer":
        names = [f"flax_transformer.{a.name}" for a in node.names]
      else:
        names = [node.module]
    else:
      continue
    for name in names:
      if name.startswith("flax_transformer."):
        found.add(name.split(".")[1])
  return found - {path.stem}


def graph() -> dict[str, set[str]]:
  return {p.stem: imports_of(p) for p in PACKAGE.glob("*.py")}


def test_every_module_has_a_layer():
  assert set(graph()) == set(LAYERS), "place new modules in LAYERS"


def test_arrows_only_point_down_or_sideways():
  upward = [(m, d) for m, deps in graph().items() for d in deps if LAYERS[d] > LAYERS[m]]
  assert not upward, upward


def test_no_cycles():
  edges = graph()
  state: dict[str, int] = {}

  def visit(node, path):
    state[node] = 1
    for dep in sorted(edges[node]):
      assert state.get(dep) != 1, "cycle: " + " -> ".join(path + [node, dep])
      if dep not in state:
        visit(dep, path + [node])
    state[node] = 2

  for node in sorted(edges):
    if node not in state:
      visit(node, [])


def test_house_rules():
  edges = graph()
  for module in NETWORK:  # The model knows nothing of data, training or search.
    assert edges[module] <= NETWORK, (module, edges[module] - NETWORK)
  assert edges["decoding"] == set()  # Search imports nothing of the package.
  assert edges["data"] <= {"tokenizer"}  # Data: only the vocabulary.
  assert edges["tokenizer"] == set()
  assert not edges["translator"] & {"loop", "data", "sources", "training"}
  assert not edges["workdir"] & {"loop", "translator", "data"}
