"""bench/common.py's shared pieces that no single bench's test covers: the process-tree
memory sampler serve.py and soak.py read their RSS/PSS/USS from."""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402

# A parent that starts a child holding 64 MB of its own pages; both live 3 s.
TREE = ("import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time; x = b\"x\" * (64 << 20); time.sleep(3)'])\n"
        "time.sleep(3)\nchild.wait()\n")


def test_tree_sampler_follows_a_process_tree_until_it_ends():
  process = subprocess.Popen([sys.executable, "-c", TREE])
  sampler = common.TreeSampler(process.pid, every_s=0.1)
  process.wait()
  time.sleep(0.3)  # The sampler's thread sees the tree gone and ends by itself.
  samples = sampler.stop()
  assert len(samples) >= 10
  assert all(set(s) <= {"main", "worker 0"} and "main" in s for s in samples)
  worker = [s["worker 0"] for s in samples if "worker 0" in s]
  assert worker and max(w["uss"] for w in worker) > 60  # MiB: the child's private pages.
  assert all(w["pss"] <= w["rss"] for w in worker)
  assert not sampler._thread.is_alive()  # noqa: SLF001


def test_resumed_from_reads_train_py_s_log_line():
  log = "I1128 loop.py:138] Resumed from the checkpoint of step 150\n"
  assert common.resumed_from(log) == 150
  assert common.resumed_from("I1128 loop.py:222] step 5/30 | loss 5.7") is None
