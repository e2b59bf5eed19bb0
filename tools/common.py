"""Shared by the tools and the benchmarks (stdlib only: bench/common.py re-exports these
under any Python): the checkout's paths, a script's flags and command line, printed
tables and JSON records."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def parser(doc: str) -> argparse.ArgumentParser:
  """A script's flags: its docstring as --help, and --json (where its record goes)."""
  out = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
  out.add_argument("--json", help="write the results here")
  return out


def command_line() -> str:
  """This script's command line, for its record, quoted as a shell reads it: 'python -m
  tools.mutants --only X' for a tool, 'python bench/soak.py --steps 300' for a bench."""
  script = Path(sys.argv[0]).resolve()
  where = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path(script.name)
  head = (["-m", f"tools.{script.stem}"] if where.parts[0] == "tools"
          else [f"bench/{script.name}"])
  return shlex.join(["python", *head, *sys.argv[1:]])


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
  """`rows` as a plain-text table of `columns` (floats to 3 decimals, or none from 100)."""
  def fmt(v):
    if isinstance(v, float):
      return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)
  cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
  print("-|-".join("-" * w for w in widths))
  for row in cells:
    print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_json(path: str | Path | None, record) -> None:
  """`record` as indented JSON at `path` (its folder made); nothing when path is None."""
  if path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
