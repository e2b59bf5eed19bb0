"""Mutation check: each paper-critical detail, broken on purpose, must fail its tests.

python -m tools.mutants                 # every mutant: a new results/bench/mutants.json
python -m tools.mutants --changed       # only those whose code changed since their run
python -m tools.mutants --only NAME ... # these; both merge into the record

A mutant is anchored to its code, not to its text: a module and a function in it
(`target`, 'flax_transformer.training.steps:Trainer._loss_sums'; a module alone for
its top level) and, inside that function, the one expression or statement whose syntax
tree equals `old`'s. Reformatting, comments, docstrings or moving the function to another
module leave the anchor as it was; the mutant replaces that node's text by `new`. Its
tests run with pytest on a scratch copy of the checkout (tracked and untracked files,
not ignored), restored after each. "caught": a test failed; "missed": they passed with
the detail broken; "timeout" (over --timeout) and "error" (any other exit) catch nothing.
The unmutated tests run first: a mutant only counts against tests that pass without it.

The record keeps, for each mutant, a digest of its function's syntax tree (docstrings
left out) at its run: --changed re-runs the mutants whose function (or whose old, new
or tests) differs from the record's, and those the record lacks. Exit 0 when every
mutant run is caught, 1 when one is not, 2 when an anchor does not resolve.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import NamedTuple

from tools.common import MULTI30K, ROOT, command_line, parser, write_json
from tools.mutant_list import MUTANTS, Mutant

RECORD = "results/bench/mutants.json"
__all__ = ["MUTANTS", "Mutant", "anchor", "check_applies", "copy_checkout", "main", "run_mutant",
           "run_tests", "stale"]


class Anchor(NamedTuple):
  """Where a mutant applies: the file (relative to the checkout), its text, the node's
  start and end offsets in it, and the digest of the function that holds it."""
  file: str
  text: str
  start: int
  end: int
  digest: str


class AnchorError(Exception):
  """A mutant's target or pattern does not resolve (one line naming what and where)."""


def module_file(root: Path, module: str) -> Path | None:
  """The source of a dotted module under root ('configs.default' -> configs/default.py)."""
  base = root.joinpath(*module.split("."))
  return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def find_function(tree: ast.AST, qualname: str) -> ast.AST | None:
  """The function (or class) `qualname` names ('Trainer._loss_sums', 'beam_search.not_done')."""
  node = tree
  for part in filter(None, qualname.split(".")):
    node = next((c for c in ast.iter_child_nodes(node)
                 if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and c.name == part), None)
    if node is None:
      return None
  return node


def where_now(root: Path, qualname: str) -> list[str]:
  """The modules of flax_transformer/ and configs/ that define `qualname` (for the hint)."""
  found = []
  for folder in ("flax_transformer", "configs"):
    for path in sorted((root / folder).rglob("*.py")):
      if qualname and find_function(ast.parse(path.read_text()), qualname) is not None:
        found.append(".".join(path.relative_to(root).with_suffix("").parts))
  return found


def shape(node: ast.AST) -> str:
  """A node's syntax tree as text, without positions or docstrings: what a reformat keeps."""
  node = ast.parse(ast.unparse(node)) if not isinstance(node, ast.Module) else node
  for n in ast.walk(node):
    body = getattr(n, "body", None)
    if (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
        and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)):
      n.body = body[1:] or [ast.Pass()]
  return ast.dump(node, annotate_fields=False)


def pattern(source: str) -> ast.AST:
  """`old` or `new` as one node: an expression, else a statement."""
  body = ast.parse(textwrap.dedent(source)).body
  if len(body) != 1:
    raise ValueError(f"{source!r} is {len(body)} statements, not one")
  return body[0].value if isinstance(body[0], ast.Expr) else body[0]


def offsets(text: str, node: ast.AST) -> tuple[int, int]:
  """A node's start and end as offsets into its file's text (ast counts columns in bytes)."""
  lines = text.splitlines(keepends=True)
  starts = [0]
  for line in lines:
    starts.append(starts[-1] + len(line))
  at = lambda row, col: starts[row - 1] + len(lines[row - 1].encode()[:col].decode())  # noqa: E731
  return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)


def anchor(mutant: Mutant, root: Path = ROOT) -> Anchor:
  """Resolves a mutant in the checkout at `root`, or raises AnchorError saying why."""
  module, _, qualname = mutant.target.partition(":")
  path = module_file(root, module)
  if path is None:
    raise AnchorError(f"{mutant.name}: no module {module} (its target {mutant.target})")
  text = path.read_text()
  function = find_function(ast.parse(text), qualname)
  if function is None:
    moved = where_now(root, qualname)
    hint = (f"; {qualname} is now in {', '.join(moved)}: update its target" if moved
            else f"; no module of flax_transformer/ or configs/ defines {qualname}")
    raise AnchorError(f"{mutant.name}: {module} has no {qualname}{hint} in tools/mutant_list.py")
  old = pattern(mutant.old)
  found = [n for n in ast.walk(function) if type(n) is type(old) and shape(n) == shape(old)]
  if len(found) != 1:
    raise AnchorError(f"{mutant.name}: its pattern {mutant.old!r} occurs {len(found)} times in "
                      f"{mutant.target} ({path.relative_to(root)}), not once")
  start, end = offsets(text, found[0])
  return Anchor(path.relative_to(root).as_posix(), text, start, end, digest(function))


def digest(function: ast.AST) -> str:
  """What --changed compares: the function's tree, positions and docstrings left out."""
  return hashlib.sha256(shape(function).encode()).hexdigest()[:16]


def mutated(mutant: Mutant, where: Anchor) -> str:
  """The anchored file's text with the mutant's node replaced by `new` (an expression in
  parentheses; a statement's further lines at the node's indent)."""
  new = textwrap.dedent(mutant.new).strip("\n")
  if isinstance(pattern(mutant.old), ast.expr):
    new = f"({new})"
  indent = " " * (where.start - where.text.rfind("\n", 0, where.start) - 1)
  new = new.replace("\n", "\n" + indent)
  text = where.text[:where.start] + new + where.text[where.end:]
  ast.parse(text)  # A mutant must still be Python: its tests then fail on the detail.
  return text


def check_applies(mutant: Mutant, root: Path = ROOT) -> str | None:
  """None if the mutant resolves to exactly one node of its function, else the problem."""
  try:
    mutated(mutant, anchor(mutant, root))
  except (AnchorError, SyntaxError, ValueError) as e:
    return str(e) if isinstance(e, AnchorError) else f"{mutant.name}: {e}"
  return None


def copy_checkout(destination: Path) -> None:
  """The working tree's files that git knows or would add (uncommitted edits included)."""
  listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                           "--exclude-standard"], capture_output=True, check=True).stdout
  for name in filter(None, listed.decode().split("\0")):
    source = ROOT / name
    if source.is_file() and not name.startswith("results/"):
      target = destination / name
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(source, target)


def run_tests(checkout: Path, tests, timeout: int) -> tuple[str, float, str]:
  """(outcome: "passed", "failed", "timeout" or "error"; seconds; last lines of output) of
  pytest on `tests` inside `checkout`."""
  env = dict(os.environ, PYTHONPATH=str(checkout), MULTI30K_DIR=str(MULTI30K))
  start = time.perf_counter()
  try:
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             *tests], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=timeout)
    output = result.stdout + result.stderr
    summary = (result.stdout.strip().splitlines() or [""])[-1]  # "1 failed, 2 passed in 3.0s"
    if result.returncode == 0:
      outcome = "passed"
    elif result.returncode == 1 and re.search(r"\b\d+ failed\b", summary):
      outcome = "failed"  # Exit status 1 alone is also a fixture's error in setup.
    else:
      outcome = "error"
      output += f"\npytest exit status {result.returncode}"
  except subprocess.TimeoutExpired:
    outcome, output = "timeout", f"timed out after {timeout} s"
  lines = [line for line in output.strip().splitlines() if line.strip()]
  return outcome, time.perf_counter() - start, "\n".join(lines[-3:])


def run_mutant(checkout: Path, mutant: Mutant, timeout: int) -> tuple[str, float, str]:
  """Patches `checkout` with `mutant`, runs its tests there and restores the file:
  ("caught", "missed", "timeout" or "error", seconds, last lines of pytest's output)."""
  where = anchor(mutant, checkout)
  path = checkout / where.file
  path.write_text(mutated(mutant, where))
  try:
    outcome, seconds, tail = run_tests(checkout, mutant.tests, timeout)
  finally:
    path.write_text(where.text)
  return {"passed": "missed", "failed": "caught"}.get(outcome, outcome), seconds, tail


def entry_matches(entry: dict, mutant: Mutant, code: str) -> bool:
  """Whether a recorded run is of this mutant as it stands (anchor and function's digest)."""
  return (entry["name"], entry["old"], entry["new"], tuple(entry["tests"]), entry["digest"]) == (
      mutant.name, mutant.old, mutant.new, mutant.tests, code)


def stale(record: dict | None, root: Path = ROOT) -> list[str]:
  """The mutants the record has no current run of: new ones, changed ones (old, new,
  tests) and those whose function's tree changed since their run."""
  runs = {e["name"]: e for e in (record or {}).get("mutants", [])}
  return [m.name for m in MUTANTS
          if m.name not in runs or not entry_matches(runs[m.name], m, anchor(m, root).digest)]


def run_all(mutants: list[Mutant], timeout: int, run_index: int) -> tuple[dict, list[dict]]:
  """The unmutated tests then each mutant, on a scratch copy: (unmutated, entries)."""
  with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
    checkout = Path(scratch)
    copy_checkout(checkout)
    every_test = sorted({t for m in mutants for t in m.tests})
    outcome, seconds, tail = run_tests(checkout, every_test, timeout)
    unmutated = {"tests": every_test, "passed": outcome == "passed", "seconds": round(seconds, 1)}
    print(f"unmutated: {outcome} in {seconds:.0f} s")
    if outcome != "passed":
      print(tail)
      return unmutated, []
    print(f"{'mutant':62} {'result':7} {'s':>5}  tests")
    entries = []
    for mutant in mutants:
      code = anchor(mutant, checkout).digest
      outcome, seconds, tail = run_mutant(checkout, mutant, timeout)
      print(f"{mutant.name:62} {outcome:7} {seconds:5.0f}  {' '.join(mutant.tests)}", flush=True)
      entries.append({**mutant._asdict(), "tests": list(mutant.tests), "digest": code,
                      "run": run_index, "outcome": outcome, "seconds": round(seconds, 1),
                      "pytest_tail": tail})
  return unmutated, entries


def main() -> int:
  flags = parser(__doc__)
  flags.set_defaults(json=RECORD)
  flags.add_argument("--only", nargs="*", default=None, help="mutant names to run")
  flags.add_argument("--changed", action="store_true",
                     help="only the mutants the record has no current run of")
  flags.add_argument("--timeout", type=int, default=900, help="seconds per pytest run")
  args = flags.parse_args()
  problems = [p for p in map(check_applies, MUTANTS) if p]
  unknown = sorted(set(args.only or ()) - {m.name for m in MUTANTS})
  if problems or unknown:
    print("\n".join(problems + [f"no mutant named {name!r}" for name in unknown]))
    return 2
  path = ROOT / args.json
  merge = args.changed or args.only is not None
  record = json.loads(path.read_text()) if merge and path.is_file() else {"runs": [], "mutants": []}
  names = set(stale(record) if args.changed else args.only or [m.name for m in MUTANTS])
  mutants = [m for m in MUTANTS if m.name in names and (args.only is None or m.name in args.only)]
  if not mutants:
    print("every mutant's run is current: nothing to run")
    return 0
  from flax_transformer import provenance

  run = {"command": command_line(), **provenance.describe()}
  run["unmutated"], entries = run_all(mutants, args.timeout, len(record["runs"]))
  if not run["unmutated"]["passed"]:
    return 2
  run["mutants_run"] = len(entries)  # With its seconds: how long a full run takes.
  run["seconds"] = round(run["unmutated"]["seconds"] + sum(e["seconds"] for e in entries), 1)
  kept = {e["name"]: e for e in record["mutants"]} | {e["name"]: e for e in entries}
  record = {"runs": record["runs"] + [run],
            "mutants": [kept[m.name] for m in MUTANTS if m.name in kept]}
  record["caught"] = sum(e["outcome"] == "caught" for e in record["mutants"])
  record["total"] = len(record["mutants"])
  print(f"this run: {sum(e['outcome'] == 'caught' for e in entries)} of {len(entries)} caught; "
        f"the record: {record['caught']} of {record['total']}")
  write_json(path, record)
  return 0 if all(e["outcome"] == "caught" for e in entries) else 1


if __name__ == "__main__":
  sys.exit(main())
