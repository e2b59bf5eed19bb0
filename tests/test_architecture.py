"""The package's import graph, read from the source (imports inside functions too):
no cycles, arrows only downwards between its parts, and the house rules."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flax_transformer"

# Each part's layer: a module may import modules of its own part and of lower layers.
LAYERS = {
    "errors": 0, "compilation": 0, "host": 0, "provenance": 0, "storage": 0,  # Bottom.
    "host_allocator": 0,  # The malloc settings the entry points re-execute with.
    "languages": 0,  # run.json's languages record (imports only the errors).
    "language_codes": 0,  # ISO 639 <-> NLLB/M2M100 codes (imports nothing of ours).
    "collectives": 0,  # What the processes agree on (one host-level collective each).
    # They import nothing of ours but each other (provenance reads host, storage errors).
    "network": 1,  # config, attention, layers, model.
    "data": 2,  # tokenizer, sources, wmt, token_cache, pipeline.
    # A run's directory: its layout and record (workdir), its checkpoints. Training
    # writes them, translation reads them: below both.
    "workdir": 3, "checkpoints": 3, "new_workdir": 3,  # (an import's workdir, written aside)
    "new_workdir": 3,  # A new workdir written whole, by one writer (import_model.py's).
    # Imported models (import_model.py): a transformers folder read, a workdir written;
    # the tokenizers an imported workdir's record names (workdir reads them).
    "pretrained": 3,
    "training": 4,  # sharding, steps, metrics, distributed, the loop's parts.
    "averaging": 4,  # The paper's checkpoint averaging: what translation loads.
    "launch_lock": 5,  # One launch per workdir: agreed on over the processes (training).
    "translation": 5,  # search, batching, translator, attention_plot.
    "evaluation": 6,  # Eval loss and BLEU during training (it translates).
    "export": 6,  # A trained model as StableHLO or CTranslate2 (it reads a translator's).
    "serving": 6,  # serve.py's HTTP app and dynamic batching (over translators).
    "loop": 7,  # The training loop: the run, its setup, its steps.
    "cli": 8,  # What the entry points share; decode.py's work.
    "__init__": 9,  # The public API.
}


def module_name(path: Path) -> str:
  parts = path.relative_to(PACKAGE).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def part(module: str) -> str:
  return module.split(".")[0]


def imports_of(path: Path) -> set[str]:
  """Package modules `path` imports, at any depth (module top or inside functions)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
        "flax_transformer"):
      # `from flax_transformer.pkg import mod` names the module mod where it is one.
      names = [f"{node.module}.{a.name}"
               if (PACKAGE / Path(*node.module.split(".")[1:], a.name + ".py")).is_file()
               else node.module for a in node.names]
    else:
      continue
    found |= {n[len("flax_transformer."):] for n in names if n.startswith("flax_transformer.")}
  return found - {module_name(path)}


def graph() -> dict[str, set[str]]:
  return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def test_every_part_has_a_layer():
  assert {part(m) for m in graph()} == set(LAYERS), "place new parts in LAYERS"


def test_arrows_only_point_down_or_within_a_part():
  upward = [(m, d) for m, deps in graph().items() for d in deps
            if LAYERS[part(d)] > LAYERS[part(m)]]
  assert not upward, upward


def test_no_cycles():
  edges = graph()
  state: dict[str, int] = {}

  def visit(node, path):
    state[node] = 1
    for dep in sorted(edges.get(node, ())):
      assert state.get(dep) != 1, "cycle: " + " -> ".join(path + [node, dep])
      if dep not in state:
        visit(dep, path + [node])
    state[node] = 2

  for node in sorted(edges):
    if node not in state:
      visit(node, [])


def test_house_rules():
  edges = graph()
  of = lambda prefix: {m: deps for m, deps in edges.items() if m.startswith(prefix)}
  for module, deps in of("network").items():  # No data, training or search in the model.
    assert {part(d) for d in deps} <= {"network"}, (module, deps)
  assert edges["translation.search"] == set()  # The search imports nothing of the package.
  bottom = {m for m in edges if LAYERS[part(m)] == 0}  # errors, compilation, host.
  # Batches: the vocabulary, the token cache, batched reads; never a source's own code.
  assert edges["data.pipeline"] - bottom <= {"data.tokenizer", "data.token_cache",
                                              "data.sources", "data.multilingual"}
  assert edges["data.token_cache"] - bottom <= {"data.tokenizer", "data.sources"}
  # tfds's builders; of ours only the errors and the one downloader.
  assert edges["data.wmt"] - bottom == {"data.download"}
  assert edges["data.download"] - bottom == set()
  assert edges["data.tokenizer"] <= {"storage"}  # Its file may be in a bucket.
  for module, deps in of("translation").items():  # No loop, no data internals.
    assert not deps & {"loop", "data.pipeline", "data.sources", "training.steps"}, module
  # The exported model's runner goes where the package does not: nothing of ours.
  assert edges["export.runner"] == set()
  # The layout's one owner reads and writes no checkpoint, metric or data itself.
  # An imported model's tokenizer is read through the kinds registered below it.
  assert edges["workdir"] - bottom <= {"data.tokenizer", "data.tokenizer_kinds", "network.config"}
  assert edges["data.tokenizer_kinds"] <= {"errors"}
  assert edges["checkpoints"] - bottom <= {"workdir", "network.config", "network.model"}


LIBRARY_FILE_LINES, FUNCTION_LINES, LOOP_LINES = 400, 60, 250


def sources_and_entry_points() -> list[Path]:
  return sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.parent.glob("*.py"))


def test_library_files_and_functions_stay_short():
  """No library file over 400 lines, loop.py at most 250; no function (nested ones
  counted on their own, and inside their parent) over 60 in the library or the scripts."""
  lines = {p: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
  assert not {str(p.relative_to(PACKAGE)): n for p, n in lines.items()
              if n > LIBRARY_FILE_LINES}
  assert lines[PACKAGE / "loop.py"] <= LOOP_LINES
  long = [f"{p.relative_to(PACKAGE.parent)}:{node.name} {node.end_lineno - node.lineno + 1}"
          for p in sources_and_entry_points() for node in ast.walk(ast.parse(p.read_text()))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]
  assert not long, long


def test_importing_the_model_loads_no_checkpoint_data_or_metric_libraries():
  """`from flax_transformer import Transformer` is for reuse in other JAX projects:
  orbax, grain, tfds, sacrebleu and sentencepiece come only with what needs them."""
  import subprocess
  import sys

  heavy = ("orbax", "grain", "tensorflow_datasets", "sacrebleu", "sentencepiece")
  code = ("import sys; from flax_transformer import Transformer, TransformerConfig; "
          f"print([m for m in {heavy!r} if m in sys.modules])")
  loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent).stdout.strip()
  assert loaded == "[]", loaded
  code = "from flax_transformer import Translator, SearchConfig; print(Translator.__name__)"
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=True, cwd=PACKAGE.parent).stdout.strip() == "Translator"


def test_the_public_names_type_checkers_see_are_those_loaded_at_run_time():
  """flax_transformer/__init__.py lists each public name twice: imported under
  TYPE_CHECKING (for type checkers and IDEs) and in _EXPORTS (loaded on first use)."""
  import flax_transformer

  tree = ast.parse((PACKAGE / "__init__.py").read_text())
  block = next(node for node in tree.body if isinstance(node, ast.If)
               and ast.unparse(node.test) == "TYPE_CHECKING")
  static = {alias.name: node.module for node in block.body for alias in node.names}
  assert static == flax_transformer._MODULE_OF  # noqa: SLF001
  assert sorted(static) == flax_transformer.__all__
  assert flax_transformer.translation.__name__ == "flax_transformer.translation"  # Subpackages too.
  with pytest.raises(AttributeError, match="no attribute 'nothing'"):
    flax_transformer.nothing  # noqa: B018


BENCH_LINES = 3000  # Issue 75: bench/ holds benchmarks; tools and fixture checks live elsewhere.


def test_bench_stays_within_its_lines():
  """bench/ at most BENCH_LINES lines in all: a tool goes to tools/, a check of the committed
  fixtures against transformers beside the fixture scripts."""
  bench = PACKAGE.parent / "bench"
  total = sum(len(p.read_text().splitlines()) for p in bench.glob("*.py"))
  assert total <= BENCH_LINES, f"bench/ is {total} lines, over {BENCH_LINES}"
