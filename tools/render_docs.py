"""Renders every measured figure of the docs from its file under results/ (or a config), so
that the docs cannot say what their files do not (docs/provenance.md, "The docs check").

python -m tools.render_docs            # rewrite every rendered table and figure in place
python -m tools.render_docs --check    # exit 1 naming each one that differs

A table sits between `<!-- render: NAME [ARGS] -->` and `<!-- end: NAME -->`: TABLES maps
NAME to its function (tools/doc_tables.py), called with ARGS (a Python expression, or a
name of docs/figures.py's ARGS; `rows` takes a JSON file's records and a template per
column). A figure is `<!--{NAME}-->TEXT<!--/-->`: docs/figures.py's FIGURES[NAME] is its
template, an f-string's fields over `namespace`, and TEXT what it renders (a bare setting,
`<!--{m30k.beam_size}-->`, is its own template). Each run folder, results/runs/NAME/, gets
a README.md rendered from its NAME.json (run_readme). Edit the JSON, the template or
results/runs/tables.json, never the rendered text.

Superseded runs are not rendered here: each has a README.md in its folder under results/,
rendered once by this script at the commit it names; --check does not re-render those.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from tools.doc_tables import (curve_points, curves, decode_runs, h100_variants, readme_results,
                               results_runs, run_json, run_readmes, soak, table, torch_runs,
                               wmt_download, wmt_scale)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "RESULTS.md", "BENCHMARKS.md", "docs/*.md")  # Also check_docs.py's.
FIGURES_FILE = "docs/figures.py"  # The docs' named figures and long tables' arguments.
BLOCK = re.compile(r"(<!-- render: (?P<name>[\w-]+)(?: (?P<args>[^\n]*?))? -->\n)(?P<body>.*?)"
                   r"(<!-- end: (?P=name) -->)", re.S)
FIGURE = re.compile(r"(?<!`)<!--(\{[^\n]*?)-->(.*?)<!--/-->", re.S)  # Not in `code`.


def doc_names(root: Path) -> list[str]:
  """DOCS' files under root, as paths relative to it ('docs/faults.md')."""
  return [path.relative_to(root).as_posix() for pattern in DOCS
          for path in sorted(root.glob(pattern))]


def rows(root: Path, path: str, keys: str | list[str], columns: dict[str, str]) -> str:
  """One row per record in the lists `keys` (one key or several, in turn) of the JSON file
  at `path` under results/: a cell is its column's template rendered as a figure's over the
  record's fields and the file's; a header likewise over the file's."""
  record = json.loads((root / "results" / path).read_text())
  records = [r for key in ([keys] if isinstance(keys, str) else keys) for r in record[key]]
  return table([render_figure(header, record) for header in columns],
               [[render_figure(template, {**record, **r}) for template in columns.values()]
                for r in records])


TABLES = {"readme-results": ("README.md", readme_results), "rows": (None, rows),
          "results-runs": ("RESULTS.md", results_runs), "wmt-scale": ("BENCHMARKS.md", wmt_scale),
          "soak": ("BENCHMARKS.md", soak), "wmt-download": ("docs/wmt14.md", wmt_download),
          "h100-variants": ("BENCHMARKS.md", h100_variants), "curves": (None, curves),
          "torch-runs": ("BENCHMARKS.md", torch_runs), "curve-points": (None, curve_points),
          "decode-runs": ("BENCHMARKS.md", decode_runs)}


class Record(dict):
  """A JSON object whose keys read as attributes too (`r.rows[4].sentences_per_s`)."""

  def __getattr__(self, key):
    try:
      return self[key]
    except KeyError:
      raise AttributeError(key) from None


def load_config(root: Path, spec: str) -> Record:
  """A config file's values ('configs/multi30k.py' or 'configs/x.py:ARG')."""
  import runpy

  path, _, arg = spec.partition(":")
  sys.path.insert(0, str(root))  # A config imports others as `configs.NAME`.
  try:
    get_config = runpy.run_path(str(root / path))["get_config"]
    config = get_config(arg) if arg else get_config()
  finally:
    sys.path.remove(str(root))
  return json.loads(json.dumps(config.to_dict()), object_hook=Record)


def search_mflop(model, search) -> list[float]:
  """Weight-matmul MFLOP of one beam-search step (2 FLOP a multiply-add) for `model`
  and a bench/decode.py record's batch x beam rows: logits, FFN, and per layer
  self-attention's four projections plus cross-attention's query and output ones (its
  keys and values are cached)."""
  rows, d, layers = search.batch * search.beam_size, model.d_model, model.num_layers
  return [2 * rows * d * model.vocab_size / 1e6, layers * 4 * rows * d * model.d_ff / 1e6,
          layers * 12 * rows * d * d / 1e6]


def namespace(root: Path) -> dict:
  """What a figure's template may name: the files under results/ (JSON as Records, other
  files as text), configs, and a few reductions."""
  cache = {}

  def load(path: str):
    """A file, relative to results/ ('bench/export.json') or, from 'configs/', a config."""
    if path not in cache:
      if path.startswith("configs/"):
        cache[path] = load_config(root, path)
      else:
        text = (root / "results" / path).read_text()
        cache[path] = json.loads(text, object_hook=Record) if path.endswith(".json") else text
    return cache[path]

  def logged(path: str, key: str, step: int | None = None):
    """A metrics.jsonl's `key`: every value logged, in order, or the one at `step`."""
    records = [json.loads(line) for line in load(path).splitlines() if line.strip()]
    values = [(r.get("step"), r[key]) for r in records if key in r]
    return [v for _, v in values] if step is None else next(v for s, v in values if s == step)

  def suite(path: str) -> Record:
    """A `/usr/bin/time -v bash .ci/run` log: tests passed, pytest's minutes, and the
    whole job's minutes (venv and install included)."""
    text = load(path)
    wall = re.search(r"Elapsed \(wall clock\).*: (\d+):([\d.]+)", text)
    return Record(tests=int(re.findall(r"(\d+) passed", text)[-1]),
                  minutes=float(re.findall(r"passed.* in ([\d.]+)s", text)[-1]) / 60,
                  job_minutes=int(wall[1]) + float(wall[2]) / 60)

  return {"load": load, "run": lambda name: load(run_json(name)[len("results/"):]),
          "device": lambda session, name="accelerator": load(f"device_runs/{session}/{name}.json"),
          "m30k": load("configs/multi30k.py"), "defaults": load("configs/default.py"),
          "bench": lambda name: load(f"bench/{name}.json"), "median": statistics.median,
          "grep": lambda path, pattern: re.findall(pattern, load(path), re.M), "re": re,
          "logged": logged, "search_mflop": search_mflop, "suite": suite}


def render_figure(template: str, names: dict) -> str:
  """An f-string template's text ('{run("x").bleu:.1f} BLEU' -> '38.6 BLEU'), parsed here
  rather than by eval(f"...") so that expressions may hold backslashes (Python 3.11)."""
  out, i = [], 0
  while i < len(template):
    if template[i] != "{":
      out.append(template[i])
      i += 1
      continue
    depth, quote, colon, j = 0, None, None, i + 1
    while quote or depth or template[j] != "}":
      c = template[j]
      if quote:
        quote = None if c == quote else quote
      elif c in "\"'":
        quote = c
      elif c in "([{":
        depth += 1
      elif c in ")]}":
        depth -= 1
      elif c == ":" and not depth and colon is None:
        colon = j
      j += 1
    expression = template[i + 1:colon or j]
    value = eval(expression, dict(names))  # noqa: S307 (our own docs' templates)
    out.append(format(value, template[colon + 1:j] if colon else ""))
    i = j + 1
  return "".join(out)


def named(root: Path) -> tuple[dict[str, str], dict[str, tuple]]:
  """docs/figures.py's FIGURES (name -> template) and ARGS (name -> a table's arguments)."""
  import runpy

  path = root / FIGURES_FILE
  module = runpy.run_path(str(path)) if path.is_file() else {}
  return module.get("FIGURES", {}), module.get("ARGS", {})


def template_of(marker: str, figures: dict[str, str]) -> tuple[str, str]:
  """(template, how a message names it) of a figure's marker: '{name}' stands for
  FIGURES[name]; any other marker is its own template."""
  name = marker[1:-1]
  if name in figures:
    return figures[name], f"{marker} = {figures[name]}"
  return marker, marker


def rendered(root: Path, wrong: list[str] | None = None) -> dict[str, str]:
  """Each doc's text with every block and figure rendered afresh; `wrong` collects
  'doc:line: template renders X, the doc says Y' for each figure that differs."""
  out, names, (figures, table_args) = {}, namespace(root), named(root)
  for name in doc_names(root):
    text = (root / name).read_text()

    def fill(match, name=name):
      doc, render = TABLES.get(match["name"], (None, None))
      if render is None or doc not in (name, None):
        raise SystemExit(f"{name}: no table named {match['name']!r} for this doc in "
                         f"tools/render_docs.py TABLES")
      args = (table_args[match["args"]] if match["args"] in table_args else
              eval(f"({match['args']},)", {"range": range}) if match["args"] else ())  # noqa: S307
      return match.group(1) + render(root, *args) + match.group(5)

    def figure(match, name=name, text=text):
      where = f"{name}:{text.count(chr(10), 0, match.start()) + 1}"
      row = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
      template, label = template_of(match[1], figures)
      if row.startswith("|") and "|" in match[0]:  # A table row: GitHub splits the cell.
        raise SystemExit(f"{where}: the figure {label} holds a '|' in a table row: "
                         "keep the cell's bars outside <!--{...}-->TEXT<!--/-->")
      try:
        value = render_figure(template, names)
      except Exception as e:  # noqa: BLE001 (any error of a template: name it, no traceback)
        raise SystemExit(f"{where}: the figure {label} does not render: {e!r}") from None
      if value.split() == match[2].split():  # A figure may break across lines.
        value = match[2]
      if value != match[2] and wrong is not None:
        wrong.append(f"{where}: {label} renders {value!r}, the doc says {match[2]!r}")
      return f"<!--{match[1]}-->{value}<!--/-->"
    out[name] = FIGURE.sub(figure, BLOCK.sub(fill, text))
  return out


def unused_names(root: Path) -> list[str]:
  """docs/figures.py's names that no doc shows (each figure is defined where it is used)."""
  texts = "".join((root / name).read_text() for name in doc_names(root))
  figures, table_args = named(root)
  return sorted({n for n in figures if f"<!--{{{n}}}-->" not in texts}
                | {n for n in table_args if not re.search(rf"<!-- render: [\w-]+ {n} -->", texts)})


def spans(text: str) -> list[tuple[int, int]]:
  """Where a doc's rendered blocks and figures are (for tools/check_docs.py)."""
  return [m.span("body") for m in BLOCK.finditer(text)] + [m.span() for m in FIGURE.finditer(text)]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--check", action="store_true", help="only compare, write nothing")
  parser.add_argument("--root", default=str(ROOT), help="the repository")
  args = parser.parse_args()
  root = Path(args.root)
  found = {m["name"] for name in doc_names(root)
           for m in BLOCK.finditer((root / name).read_text())}
  missing = sorted(set(TABLES) - found)
  if missing:
    print(f"no markers for the tables {missing} in the docs")
    return 2
  stale, wrong = [], []
  for name, text in {**rendered(root, wrong), **run_readmes(root)}.items():
    path = root / name
    if not path.is_file() or text != path.read_text():
      stale.append(name)
      if not args.check:
        path.write_text(text)
  if args.check and stale:
    print("\n".join(wrong))
    print(f"{', '.join(stale)}: rendered tables or pages differ from their data; run "
          "python -m tools.render_docs (and edit the JSON or the row lists, not the tables)")
    return 1
  unused = unused_names(root)
  if unused:
    print(f"{FIGURES_FILE}: no doc shows {', '.join(unused)}: remove them or show them")
    return 2
  texts = [(root / name).read_text() for name in doc_names(root)]
  tables, figures = (sum(len(pattern.findall(text)) for text in texts) for pattern in (BLOCK, FIGURE))
  print(f"{tables} tables, {figures} figures and the run folders' pages {'checked' if args.check else 'rendered'}"
        + (f"; rewrote {', '.join(stale)}" if stale and not args.check else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
