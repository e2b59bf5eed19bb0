"""The docs' figures match the JSON files they come from (bench/check_docs.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check_docs(root: Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / "bench/check_docs.py"), f"--root={root}"],
                        capture_output=True, text=True, timeout=60)


def test_every_checked_figure_matches_its_file():
  result = check_docs(ROOT)
  assert result.returncode == 0, result.stdout


def test_a_drifted_figure_is_named(tmp_path):
  for name in ("README.md", "RESULTS.md", "BENCHMARKS.md"):
    (tmp_path / name).write_text((ROOT / name).read_text())
  os.symlink(ROOT / "results", tmp_path / "results")
  readme = tmp_path / "README.md"
  readme.write_text(readme.read_text().replace("| 40.4 | 40.9 | 64.3 |", "| 40.4 | 41.9 | 64.3 |"))
  result = check_docs(tmp_path)
  assert result.returncode == 1
  assert "configs/multi30k_best.py:en-de" in result.stdout and "'40.9'" in result.stdout
