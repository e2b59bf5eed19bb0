"""Nothing lost to a second signal (issue 74, item 4): a SIGTERM repeated during the save
the first one asked for is ignored and the save finishes; a second SIGINT exits at once
in one line, and the complete checkpoints stay readable and resumable."""

import re
import subprocess
from pathlib import Path

import pytest

import conftest
from conftest import cpu_env, train_command
from flax_transformer.checkpoints import Checkpointer

# train.py in this process. Once step STOP_AFTER is dispatched (and step 5's periodic save
# has finished) it sends itself FIRST; the stop's save then writes its arrays with each
# write held 1 s as a loaded machine holds it (tests/test_reliability.py's writes_held),
# and 50 ms into the first held write this process sends itself SECOND: it lands inside
# that save.
SIGNALS_IN_A_SAVE = """
import asyncio, os, runpy, signal, sys
sys.argv = ["train.py", *sys.argv[1:]]
sys.path.insert(0, os.getcwd())
from orbax.checkpoint._src.serialization import serialization
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.training.steps import Trainer
FIRST, SECOND = (getattr(signal, os.environ[name]) for name in ("FIRST", "SECOND"))
STOP_AFTER, steps, sent, checkpointers = int(os.environ["STOP_AFTER"]), [0], [], []
train_step, write, init = (Trainer.train_step, serialization.async_serialize_from_host,
                           Checkpointer.__init__)
def watched_init(self, *args, **kwargs):
  init(self, *args, **kwargs)
  checkpointers.append(self)
def watched_step(self, state, batch):
  steps[0] += 1
  if steps[0] == STOP_AFTER:
    checkpointers[-1].wait()  # Step 5's save: its writes are not the stop's.
    sent.append("first")
    os.kill(os.getpid(), FIRST)
  return train_step(self, state, batch)
async def held_write(value, *args, **kwargs):
  if sent == ["first"]:
    sent.append("second")
    await asyncio.sleep(0.05)
    print("WATCHED second signal inside the save", file=sys.stderr, flush=True)
    os.kill(os.getpid(), SECOND)
  if sent:
    await asyncio.sleep(1.0)
  return await write(value, *args, **kwargs)
Checkpointer.__init__, Trainer.train_step = watched_init, watched_step
serialization.async_serialize_from_host = held_write
runpy.run_path("train.py", run_name="__main__")
"""


def signals_in_a_save(workdir: Path, multi30k_dir, first: str, second: str):
  command = train_command(workdir, multi30k_dir, "--config.num_train_steps=100000",
                          "--config.checkpoint_every_steps=5",
                          "--config.log_every_steps=100000")
  return subprocess.run([command[0], "-c", SIGNALS_IN_A_SAVE, *command[2:]], cwd=conftest.ROOT,
                        env=dict(cpu_env(), STOP_AFTER="8", FIRST=first, SECOND=second),
                        capture_output=True, text=True, timeout=300)


def test_a_repeated_sigterm_during_the_save_is_ignored_and_the_save_finishes(tmp_path,
                                                                            multi30k_dir):
  """Two SIGTERMs, the second 50 ms into the stop's save (a launcher forwarding the signal
  it also received): one line says it is ignored, the save finishes, exit 0, no partial
  checkpoint. Before: a KeyboardInterrupt traceback inside orbax, exit 130, and the
  checkpoint left as N.orbax-checkpoint-tmp."""
  done = signals_in_a_save(tmp_path, multi30k_dir, "SIGTERM", "SIGTERM")
  assert "WATCHED second signal inside the save" in done.stderr, done.stderr[-3000:]
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
  assert len(re.findall(r"SIGTERM again: ignored", done.stderr)) == 1, done.stderr[-3000:]
  stopped = int(re.search(r"Stopped by SIGTERM at step (\d+)", done.stderr)[1])
  assert 8 <= stopped <= 10
  assert Checkpointer(tmp_path, read_only=True).steps() == [5, stopped]
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(
      ["5", str(stopped)])


@pytest.mark.parametrize("first", ["SIGTERM", "SIGINT"])
def test_a_second_sigint_during_the_save_exits_in_one_line_and_the_run_resumes(
    tmp_path, multi30k_dir, first):
  """A SIGTERM or SIGINT, then SIGINT (Ctrl-C again) 50 ms into the stop's save: the
  process exits at once, 130, with one line and no traceback; the complete checkpoint
  (step 5) is readable, and the next launch resumes from it. Before: a KeyboardInterrupt
  traceback inside orbax."""
  done = signals_in_a_save(tmp_path, multi30k_dir, first, "SIGINT")
  assert "WATCHED second signal inside the save" in done.stderr, done.stderr[-3000:]
  assert done.returncode == 130, done.stderr[-3000:]
  assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
  assert [line for line in done.stderr.splitlines() if line.startswith("error")] == [
      "error: SIGINT again: exiting at once, without waiting for a checkpoint being saved; "
      f"the complete ones in {tmp_path / 'checkpoints'} are intact, and the next launch "
      "resumes from the newest"], done.stderr[-3000:]
  assert Checkpointer(tmp_path, read_only=True).steps() == [5]
  resumed = subprocess.run(train_command(tmp_path, multi30k_dir, "--config.num_train_steps=6",
                                         "--config.checkpoint_every_steps=5"),
                           env=cpu_env(), capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from the checkpoint of step 5" in resumed.stderr
  assert Checkpointer(tmp_path, read_only=True).steps() == [5, 6]
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["5", "6"]
