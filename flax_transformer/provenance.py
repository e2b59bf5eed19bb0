"""What produced a result: the code's git commit, the package versions, the machine.

Training writes it into the workdir's run record at every launch, and result files
copy it, so a figure can be traced to the code and software that made it.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from flax_transformer import host

PACKAGES = ("flax-transformer", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain",
            "tensorflow-datasets", "sentencepiece", "sacrebleu", "ml-collections", "numpy")
REPOSITORY = Path(__file__).resolve().parents[1]


def git_commit(directory: Path = REPOSITORY) -> dict:
  """{'git_commit': hash, 'git_dirty': bool}, or {} outside a git checkout.

  A dirty tree (tracked files changed since the commit) also records which files
  and the whole `git diff HEAD`, so that the code that ran can be rebuilt from the
  commit and the record: a run is never launched from code no one can recover.
  """
  try:
    run = lambda *args: subprocess.run(  # noqa: E731
        ["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=30,
        check=True).stdout
    record = {"git_commit": run("rev-parse", "HEAD").strip()}
    changed = [line[3:] for line in run("status", "--porcelain",
                                        "--untracked-files=no").splitlines() if line.strip()]
    record["git_dirty"] = bool(changed)
    if changed:
      record.update(git_dirty_files=changed, git_diff=run("diff", "HEAD", "--no-color"))
    return record
  except (OSError, subprocess.SubprocessError):
    return {}


def commit() -> dict:
  """{'git_commit', 'git_dirty'} alone (no diff): for small records such as manifests."""
  return {k: v for k, v in git_commit().items() if k in ("git_commit", "git_dirty")}


def package_versions() -> dict[str, str]:
  versions = {"python": sys.version.split()[0]}
  for name in PACKAGES:
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return versions


def describe(devices=None) -> dict:
  """Commit, package versions, machine; with `devices` (jax devices), their kind and count."""
  record = {**git_commit(), "packages": package_versions(), "machine": host.describe()}
  if devices:
    record["machine"].update(platform=devices[0].platform, device_kind=devices[0].device_kind,
                             devices=len(devices))
  return record
