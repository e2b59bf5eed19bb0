"""The docs cannot drift from the evidence: rendered tables and figures equal what their
files render (tools/render_docs.py), and every other number is a setting or label that
a NON_FIGURES, SETTINGS or PHRASES entry names (tools/check_docs.py), so a changed or
unbacked figure anywhere fails here. The
module example in docs/modules.md runs as written, and every relative link resolves."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import check_docs, render_docs

ROOT = Path(__file__).resolve().parents[1]


def run(tool: str, root: Path, *args) -> subprocess.CompletedProcess:
  """`python -m tools.TOOL --root=ROOT ARGS` from the checkout."""
  return subprocess.run([sys.executable, "-m", f"tools.{tool}", f"--root={root}", *args],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture
def copy(tmp_path):
  """The docs, the configs and the test conftest in a scratch root; results/ linked."""
  for name in render_docs.doc_names(ROOT):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / name, tmp_path / name)
  shutil.copy(ROOT / render_docs.FIGURES_FILE, tmp_path / render_docs.FIGURES_FILE)
  shutil.copytree(ROOT / "configs", tmp_path / "configs")
  (tmp_path / "tests").mkdir()
  shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
  os.symlink(ROOT / "results", tmp_path / "results")
  os.symlink(ROOT / "flax_transformer", tmp_path / "flax_transformer")
  return tmp_path


def edit(path: Path, old: str, new: str) -> None:
  text = path.read_text()
  assert text.count(old) >= 1, old
  path.write_text(text.replace(old, new, 1))


def test_rendered_tables_are_what_their_data_renders():
  result = run("render_docs", ROOT, "--check")
  assert result.returncode == 0, result.stdout


def test_every_number_is_checked_rendered_or_a_setting():
  result = run("check_docs", ROOT)
  assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("doc, old, new", [
    ("README.md", "| 40.4 | 40.9 | 64.3 |", "| 40.4 | 41.9 | 64.3 |"),
    # A table on a docs/ page (WMT14's downloads).
    ("docs/wmt14.md", "| 1.70 GB |", "| 1.71 GB |"),
    # A train-step run's row (rendered; check_docs no longer re-checks its cells).
    ("BENCHMARKS.md", "| run1 | small | 368 | 58.6% |", "| run1 | small | 369 | 58.6% |"),
    # A cell of a table of JSON records (`rows`: serve.py's load, its column template).
    ("BENCHMARKS.md", "| 1 | 1000 | 33.1 | 115.0 |", "| 1 | 1000 | 33.2 | 115.0 |"),
    # A validation curve's cell (RESULTS' by-step tables, rendered from each run's JSON).
    ("RESULTS.md", "| 21.8 | 32.6 | 35.6 |", "| 21.8 | 32.7 | 35.6 |"),
])
def test_a_changed_rendered_figure_fails(copy, doc, old, new):
  edit(copy / doc, old, new)
  result = run("render_docs", copy, "--check")
  assert result.returncode == 1 and doc in result.stdout


@pytest.mark.parametrize("doc, old, new, named", [
    # A figure in a hand-written table (the input pipeline's row).
    ("BENCHMARKS.md", "-->220,276<!--/-->", "-->220,277<!--/-->", "tokens_per_s"),
    # A figure in README prose (from the README job's JSON).
    ("README.md", "21.7 minutes of training", "21.8 minutes of training", "train_wall_s / 60"),
    # A setting in README prose (against configs/multi30k.py).
    ("README.md", "BLEU every <!--{m30k.bleu_every_steps}-->400",
     "BLEU every <!--{m30k.bleu_every_steps}-->500", "bleu_every_steps"),
    # A figure computed by a formula (the search step's matmul count).
    ("BENCHMARKS.md", "-->307 MFLOP", "-->308 MFLOP", "search_mflop"),
    # A figure comparing two runs' JSON files (their BLEU difference).
    ("RESULTS.md", "-->0.6 BLEU below", "-->0.9 BLEU below", "0.9 BLEU below"),
    # A sentence's figure derived from several runs' JSON (two medians' ratio).
    ("BENCHMARKS.md", "-->1.17x faster<!--/-->", "-->1.18x faster<!--/-->", "s_per_batch"),
    # A figure in an aims table (the H100 run's README job).
    ("BENCHMARKS.md", "-->77.4<!--/--> s (", "-->77.5<!--/--> s (", "readme_job_wall_s"),
    # A figure on a docs/ page (the H100 run's JSON).
    ("docs/accelerators.md", "-->6.1<!--/--> ms/step", "-->6.2<!--/--> ms/step",
     "readme_job_ms_per_step"),
    # A cell's bar inside a figure in a table row: GitHub would split the cell there.
    ("docs/provenance.md", "-->1e-6<!--/--> |", " |-->1e-6 |<!--/-->", "holds a '|'"),
])
def test_a_changed_figure_fails(copy, doc, old, new, named):
  edit(copy / doc, old, new)
  result = run("render_docs", copy, "--check")
  said = result.stdout + result.stderr  # A figure that cannot render: one line on stderr.
  assert result.returncode == 1 and doc in said
  assert named in said


def test_a_changed_named_figure_fails(copy):
  """A figure's template lives in docs/figures.py: changing it there fails --check on the
  doc that shows it, naming the figure; a name no doc shows, or one the docs show but
  figures.py lacks, is one line."""
  edit(copy / render_docs.FIGURES_FILE, '.train_wall_s / 60:.1f} minutes of training',
       '.train_wall_s / 60:.2f} minutes of training')
  result = run("render_docs", copy, "--check")
  assert result.returncode == 1
  assert "README.md:" in result.stdout and "{paper_exact_training_time} = " in result.stdout
  shutil.copy(ROOT / render_docs.FIGURES_FILE, copy / render_docs.FIGURES_FILE)
  edit(copy / render_docs.FIGURES_FILE, "FIGURES = {", "FIGURES = {\n    'spare': '{1}',")
  result = run("render_docs", copy, "--check")
  assert result.returncode == 2 and "no doc shows spare" in result.stdout
  edit(copy / "README.md", "<!--{paper_exact_decode_cores}-->", "<!--{paper_exact_cores}-->")
  result = run("render_docs", copy, "--check")
  assert result.returncode == 1
  assert "the figure {paper_exact_cores} does not render: NameError" in result.stderr


# A figure's marker in a doc: a name from docs/figures.py or a bare setting (m30k.beam_size).
MARKER = re.compile(r"^\{[A-Za-z_][\w.]*(?::[^{}]*)?\}$")


def test_the_docs_read_raw():
  """No expression in a doc's prose: each figure is a name or a setting; and no line
  outside a table is over 200 characters."""
  for name in render_docs.doc_names(ROOT):
    text = (ROOT / name).read_text()
    assert [m[1] for m in render_docs.FIGURE.finditer(text) if not MARKER.match(m[1])] == [], name
    assert [i for i, line in enumerate(text.splitlines(), 1)
            if len(line) > 200 and not line.startswith("|")] == [], name


@pytest.mark.parametrize("doc, old, new, named", [
    ("README.md", "Curves (from", "Curves (3.5x smoother than before, from", "3.5"),
    ("BENCHMARKS.md", "Filler rows: the last batch",
     "Filler rows (2.5x more of them): the last batch", "2.5"),
    ("docs/faults.md", "the same command resumes", "the same command resumes 3.5x faster", "3.5"),
    # A number beside a rendered figure is no part of it.
    ("docs/accelerators.md", "-->6.1<!--/--> ms/step", "-->6.1<!--/--> (15) ms/step", "15"),
])
def test_a_new_number_fails(copy, doc, old, new, named):
  edit(copy / doc, old, new)
  result = run("check_docs", copy)
  assert result.returncode == 1, result.stdout
  assert f"{doc}:" in result.stdout and f": {named} is not rendered" in result.stdout


def test_a_figure_renders_from_its_template():
  names = {**render_docs.namespace(ROOT), "log": "== 12 passed in 3.5s"}
  assert render_docs.render_figure('{m30k.beam_size} and {re.search(r"(\\d+) passed", log)[1]}:'
                                   '{2 / 3:.2f}', names) == "4 and 12:0.67"
  # The text a figure's markers hold is the whole figure: '44' is not '4'.
  text = "<!--{m30k.beam_size}-->4<!--/--> <!--{m30k.beam_size}-->44<!--/-->"
  assert [m[2] for m in render_docs.FIGURE.finditer(text)] == ["4", "44"]


def test_settings_are_exempt_and_measurements_are_not():
  doc = check_docs.Doc("With dropout 0.2, beam 4 and the last 5 averaged, the 4000-step run "
                       "scored 38.5 BLEU in 12.3 minutes at step 3600 on 2 cores, within 0.3 "
                       "BLEU of the other and at least 2x faster (aim 1.5x).\n")
  found = check_docs.uncovered({"README.md": doc, "RESULTS.md": check_docs.Doc(""),
                                "BENCHMARKS.md": check_docs.Doc("")}, {})
  assert [entry.split("\t")[0] for _, _, entry in found] == ["38.5", "12.3", "0.3", "2"]


def python_block(doc: Path, heading: str) -> str:
  """The first ```python block after `heading` in doc."""
  text = doc.read_text()
  return re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)


def test_the_module_example_runs_as_written():
  """docs/modules.md's first example, executed as it stands: its incremental decoding
  step gives the teacher-forced model's first-position logits."""
  import jax.numpy as jnp
  import numpy as np

  example = {}
  exec(python_block(ROOT / "docs" / "modules.md", "# Reusing the modules"), example)
  model, params = example["model"], example["params"]
  forced = model.apply({"params": params}, example["inputs"], example["targets"])
  step = example["logits"]
  assert step.shape == (1, 1, example["config"].vocab_size)
  assert bool(jnp.isfinite(step).all())
  np.testing.assert_allclose(step, forced[:, :1], atol=1e-5)


# A relative link target in markdown: [text](target) or ![alt](target), no URL scheme.
LINK = re.compile(r"!?\[[^\]]*\]\((?![a-z]+:)([^)\s#]*)(?:#[^)\s]*)?\)")


def broken_links(root: Path) -> list[str]:
  """'doc: target' for each relative link in the docs (README, docs/, ...) naming no file."""
  return [f"{name}: {target}" for name in render_docs.doc_names(root)
          for target in LINK.findall((root / name).read_text())
          if target and not ((root / name).parent / target).exists()]


def test_every_relative_link_resolves():
  assert broken_links(ROOT) == []
  assert LINK.findall("[a](docs/faults.md#x) ![b](results/c.png) [u](https://x.org/y)") == [
      "docs/faults.md", "results/c.png"]


def test_a_broken_link_is_found(copy):
  edit(copy / "README.md", "(docs/faults.md)", "(docs/fault.md)")
  edit(copy / "docs" / "multi_host.md", "(faults.md)", "(../faults.md)")
  assert broken_links(copy) == ["README.md: docs/fault.md", "docs/multi_host.md: ../faults.md"]


# A results/ path the docs, bench/ or tools/ name, and the flag before it when decode.py's
# --attention_plot (a stem: decode.py writes <stem>_<n>.png).
RESULTS_PATH = re.compile(r"(--attention_plot=)?(?<![\w/.-])(results/[\w./{},<>*+-]*)")


def expansions(path: str) -> list[str]:
  """The globs a named path stands for: '{a,b}' and '{1..3}' each alternative;
  placeholders ('{}', '{run}', '<device>', 'NAME') any name."""
  brace = re.search(r"\{([^{}]*(?:,|\.\.)[^{}]*)\}", path)
  if brace:
    lo, dots, hi = brace[1].partition("..")
    parts = [str(i) for i in range(int(lo), int(hi) + 1)] if dots else brace[1].split(",")
    return [g for part in parts
            for g in expansions(path[:brace.start()] + part + path[brace.end():])]
  return [re.sub(r"\{[^{}]*\}|<[^<>]*>|\bNAME\b", "*", path)]


def missing_results(root: Path) -> list[str]:
  """'file: path' for each results/ path named in the docs, bench/*.py or tools/*.py
  (defaults, usage lines, the files check_docs reads) that no file matches."""
  files = render_docs.doc_names(root) + [p.relative_to(root).as_posix()
                                         for folder in ("bench", "tools")
                                         for p in sorted(root.glob(f"{folder}/*.py"))]
  missing = []
  for name in files:
    for stem, path in RESULTS_PATH.findall((root / name).read_text()):
      path = path.rstrip(".,")
      if stem:
        path = path.replace(".png", "_*.png")
      if not all(any(root.glob(g)) for g in expansions(path)):
        missing.append(f"{name}: {path}")
  return missing


def test_every_named_results_path_exists(copy):
  assert missing_results(ROOT) == []
  assert expansions("results/x_{1..2}/{a,b}_{}.json") == [
      "results/x_1/a_*.json", "results/x_1/b_*.json", "results/x_2/a_*.json",
      "results/x_2/b_*.json"]
  # A path the layout moved, named in a doc as it was.
  edit(copy / "docs/provenance.md", "`results/ci/", "`results/scaling.json`, `results/ci/")
  assert missing_results(copy) == ["docs/provenance.md: results/scaling.json"]


def test_each_run_folder_has_the_page_its_record_renders(copy):
  """results/runs/NAME/README.md is rendered from NAME.json: a changed figure on it, or
  a missing page, fails --check (runs/ copied, the rest of results/ linked)."""
  (copy / "results").unlink()
  (copy / "results").mkdir()
  for entry in (ROOT / "results").iterdir():
    if entry.name != "runs":
      os.symlink(entry, copy / "results" / entry.name)
  shutil.copytree(ROOT / "results" / "runs", copy / "results" / "runs")
  assert run("render_docs", copy, "--check").returncode == 0
  page = "results/runs/multi30k_en-de_paper_exact/README.md"
  edit(copy / page, "| 38.57 |", "| 38.58 |")
  (copy / "results/runs/multi30k_en-fr/README.md").unlink()
  result = run("render_docs", copy, "--check")
  assert result.returncode == 1
  assert page in result.stdout and "results/runs/multi30k_en-fr/README.md" in result.stdout
  assert run("render_docs", copy).returncode == 0  # Writes them back.
  assert (copy / page).read_text() == (ROOT / page).read_text()


def test_each_paragraphs_bench_json_has_its_command_in_benchmarks():
  """Every committed serve_paragraphs*.json (issue 78's load bench, its variants included)
  is shown in BENCHMARKS.md with the command that wrote it, so a reader can rerun it."""
  import json

  text = (ROOT / "BENCHMARKS.md").read_text()
  flat = " ".join(re.sub(r"\\\n", " ", text).split())
  missing = [path.name for path in sorted((ROOT / "results/bench").glob("serve_paragraphs*.json"))
             if " ".join(json.loads(path.read_text())["command"].split()) not in flat]
  assert not missing, f"BENCHMARKS.md lacks the commands of {missing}"
