"""host_allocator: with its settings a freed large block is reused, not faulted in anew."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from flax_transformer import host_allocator

ROOT = Path(__file__).resolve().parents[1]

# Allocates, fills and frees a 200 MB array four times after a first one, and prints
# the page faults those four took (a fresh 200 MB is ~49k faults of 4 kB pages). numpy's
# own huge-page advice is off so that its arrays fault like XLA's buffers.
CHILD = """
import resource, sys
import numpy as np
from flax_transformer import host_allocator
host_allocator.reexec_with_reusable_malloc()
# numpy >= 2 keeps it in np._core, 1.26 in np.core.
(getattr(np, "_core", None) or np.core).multiarray._set_madvise_hugepage(False)
np.ones(25_000_000).sum()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
  np.ones(25_000_000).sum()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
print(host_allocator.describe())
"""

needs_glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="GLIBC_TUNABLES exists only with glibc")


def run_child(**env_changes) -> tuple[int, str]:
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", host_allocator.OPT_OUT)}
  env.update(env_changes)
  out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=120, check=True).stdout.split("\n")
  return int(out[0]), out[1]


@needs_glibc
def test_reexec_makes_large_blocks_reusable_where_system_malloc_faults_every_time():
  reused, described = run_child()
  assert described == f"GLIBC_TUNABLES={host_allocator.TUNABLES}"
  # The control: the same child without the settings pays for fresh pages each time
  # (four 200 MB blocks). Compared, not against absolute counts: page sizes differ.
  fresh, control = run_child(**{host_allocator.OPT_OUT: "1"})
  assert control == "system default malloc"
  assert reused * 20 < fresh, (reused, fresh)


@needs_glibc
def test_user_tunables_are_left_alone():
  _, described = run_child(GLIBC_TUNABLES="glibc.malloc.check=0")
  assert described == "GLIBC_TUNABLES=glibc.malloc.check=0"


@needs_glibc
def test_accelerator_hosts_keep_the_system_malloc():
  # Measured to help CPU steps only: where JAX runs on a GPU/TPU, no re-exec.
  _, described = run_child(JAX_PLATFORMS="cuda")
  assert described == "system default malloc"
  assert host_allocator.accelerator_host() is False  # The suite runs with JAX_PLATFORMS=cpu.


ENTRY_POINTS = ("train.py", "decode.py", "export.py", "serve.py", "average_checkpoints.py",
                "prepare_data.py")


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_entry_points_reexec_before_any_import(script):
  """The re-exec replaces the process: whatever was imported before it is imported twice."""
  import ast

  body = ast.parse((ROOT / script).read_text()).body
  first = body[1]  # After the module docstring.
  assert isinstance(first, ast.If) and ast.unparse(first.test) == "__name__ == '__main__'"
  assert "host_allocator.reexec_with_reusable_malloc()" in ast.unparse(first)


@needs_glibc
def test_a_launch_loads_jax_once():
  """decode.py up to its first error (a missing workdir): the re-exec comes before JAX loads,
  so JAX's import shows once in the import log of both processes (one pid, one stderr)."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", host_allocator.OPT_OUT)}
  done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "decode.py"),
                         f"--workdir={ROOT / 'no-such-workdir'}"], stdin=subprocess.DEVNULL,
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stderr[-2000:]
  assert "no-such-workdir" in done.stderr.splitlines()[-1]
  jax_imports = [line for line in done.stderr.splitlines()
                 if line.startswith("import time:") and line.split("|")[-1].strip() == "jax"]
  assert len(jax_imports) == 1, jax_imports
