"""Fault matrix: kill -9 at random moments, SIGTERM, damaged checkpoints, a process of a
two-process run lost; prints a table.

python bench/faults.py [--kills 5] [--steps 80] [--json PATH] [--no-two_process]
Trains configs/tiny.py on Multi30k (../shared/data/multi30k), float32 on one CPU
device. An uninterrupted run is the reference; the interrupted run is killed
--kills times at random moments (each once that launch has logged a step at or past a
drawn one, later than the last kill's, then up to 0.5 s more: stepping, saving,
evaluating) and restarted each time; the final
parameters must equal the reference bit for bit.
Two processes (jax.distributed on localhost, 4 simulated CPU devices each): process 1
is killed halfway, then (a second run) while a checkpoint is being written, then
process 0; the survivor's exit code, time to exit and error lines are recorded. Two
more runs get SIGTERM on both processes, and SIGINT on process 1 alone: both must stop
after the same step and save it. Each time both are relaunched and must end where an
uninterrupted two-process run does.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import MULTI30K, bench_command, final_params, parser, print_table, resumed_from, \
    same_params, train_command, write_json

from flax_transformer import provenance
from flax_transformer.checkpoints import Checkpointer
from flax_transformer.training.metrics import read_metrics


def command(workdir: Path, steps: int) -> list[str]:
  return train_command("tiny.py", workdir, {
      "manual_dir": MULTI30K, "num_train_steps": steps, "checkpoint_every_steps": 10,
      "eval_every_steps": 20, "bleu_every_steps": 40, "num_bleu_sentences": 16,
      "log_every_steps": 5})


def run(cmd, env) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, env=env, capture_output=True, text=True)


def steps_logged(workdir: Path) -> list[int]:
  """The steps logged, every launch's, in order."""
  return [r["step"] for r in read_metrics(workdir)]


def last_step_logged(workdir: Path) -> int:
  steps = steps_logged(workdir)
  return steps[-1] if steps else 0


def free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def two_processes(workdir: Path, steps: int, log_dir: Path, tag: str = "") -> list[subprocess.Popen]:
  """Both processes of a jax.distributed run on localhost, 4 simulated CPU devices each;
  their logs go to log_dir/process{i}{tag}.log."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  port = free_port()
  return [subprocess.Popen(
      command(workdir, steps) + [f"--coordinator_address=localhost:{port}", "--num_processes=2",
                                 f"--process_id={i}"],
      env=env, stdout=subprocess.DEVNULL, stderr=open(log_dir / f"process{i}{tag}.log", "w"))
      for i in range(2)]


def relaunch_both(workdir: Path, steps: int) -> tuple[int, object, int | None]:
  """Relaunches both processes to the end: (final step, parameters, step resumed from)."""
  for i, p in enumerate(two_processes(workdir, steps, workdir, tag="_relaunch")):
    assert p.wait(timeout=900) == 0, (workdir / f"process{i}_relaunch.log").read_text()[-3000:]
  step, params = final_params(workdir)
  return step, params, resumed_from((workdir / "process0_relaunch.log").read_text())


def wait_survivor(process: subprocess.Popen, since: float) -> tuple[int | str, float]:
  try:
    code = process.wait(timeout=300)
  except subprocess.TimeoutExpired:
    process.kill()
    code = "still running after 300 s"
  return code, time.time() - since


def kill_halfway(workdir: Path, steps: int, victim: int) -> tuple[object, float, str, int]:
  """kill -9 of process `victim` once the log passes half the steps: the survivor's exit
  code, seconds to exit, log, and the steps lost (logged past the last checkpoint)."""
  processes = two_processes(workdir, steps, workdir)
  while last_step_logged(workdir) < steps // 2 and processes[0].poll() is None:
    time.sleep(0.1)
  processes[victim].send_signal(signal.SIGKILL)
  code, survivor_s = wait_survivor(processes[1 - victim], time.time())
  processes[victim].wait()
  log = (workdir / f"process{1 - victim}.log").read_text()
  saved = Checkpointer(workdir, read_only=True).steps()
  return code, survivor_s, log, max(0, last_step_logged(workdir) - (saved[-1] if saved else 0))


def _killed_peer(workdir: Path, steps: int, expected, victim: int, fault: str, describe):
  """kill -9 of `victim` halfway, then both relaunched; `describe(log)` -> (outcome
  words for the survivor's log, extra fields)."""
  code, survivor_s, log, lost = kill_halfway(workdir, steps, victim=victim)
  words, extra = describe(log)
  step, params, _ = relaunch_both(workdir, steps)
  return {"fault": fault, "times": 1,
          "outcome": f"survivor exit {code} after {survivor_s:.1f} s, {words}; "
                     f"relaunched both to {step}",
          "params_equal": same_params(params, expected), "steps_lost_max": lost,
          "survivor_exit_code": code, "survivor_exit_s": survivor_s, **extra}


def lost_process(workdir: Path, steps: int, expected) -> dict:
  """Process 1 lost: the survivor must exit fast with one line naming it."""
  return _killed_peer(workdir, steps, expected, 1, "two processes, kill -9 of process 1",
                      lambda log: (f"{log.count('Traceback')} tracebacks", {
                          "survivor_error_lines": [line for line in log.splitlines()
                                                   if line.startswith("error:")]}))


def killed_while_saving(workdir: Path, steps: int, expected) -> dict:
  """kill -9 of process 1 while orbax writes a checkpoint (its temporary directory
  exists: the step is not yet complete), from half the steps on."""
  processes = two_processes(workdir, steps, workdir)
  directory = workdir / "checkpoints"
  saving = None
  while saving is None and processes[0].poll() is None:
    names = os.listdir(directory) if directory.is_dir() else []
    pending = [int(n.split(".")[0]) for n in names if ".orbax-checkpoint-tmp" in n]
    if pending and max(pending) >= steps // 2:
      saving = max(pending)
      processes[1].send_signal(signal.SIGKILL)
    else:
      time.sleep(0.002)
  assert saving is not None, (workdir / "process0.log").read_text()[-3000:]
  code, survivor_s = wait_survivor(processes[0], time.time())
  processes[1].wait()
  log = (workdir / "process0.log").read_text()
  complete = Checkpointer(workdir, read_only=True).steps()
  step, params, resumed = relaunch_both(workdir, steps)
  return {"fault": "two processes, kill -9 of process 1 during a save", "times": 1,
          "outcome": f"killed saving step {saving}; survivor exit {code} after "
                     f"{survivor_s:.1f} s; resumed from {resumed}, relaunched both to {step}",
          "params_equal": same_params(params, expected),
          "steps_lost_max": max(0, saving - (resumed or 0)),
          "step_being_saved": saving, "complete_steps_after_kill": complete,
          "resumed_from": resumed, "half_written_step_read": resumed == saving,
          "survivor_exit_code": code, "survivor_exit_s": survivor_s,
          "survivor_tracebacks": log.count("Traceback")}


def preempted(workdir: Path, steps: int, expected,
              signals=(signal.SIGTERM, signal.SIGTERM)) -> dict:
  """`signals[i]` to process i (None: none), 0.5 s apart as a scheduler's notices
  arrive, once the log passes half the steps: both must stop after one agreed step
  and save it."""
  processes = two_processes(workdir, steps, workdir)
  while last_step_logged(workdir) < steps // 2 and processes[0].poll() is None:
    time.sleep(0.1)
  signalled = time.time()
  for p, sig in zip(processes, signals):
    if sig is not None:
      p.send_signal(sig)
      time.sleep(0.5)
  codes = [p.wait(timeout=300) for p in processes]
  exit_s = time.time() - signalled
  stopped = []
  for i in range(2):
    found = re.search(r"Stopped by (\w+) at step (\d+)",
                      (workdir / f"process{i}.log").read_text())
    stopped.append(int(found.group(2)) if found else None)
  saved = Checkpointer(workdir, read_only=True).steps()
  step, params, resumed = relaunch_both(workdir, steps)
  sent = [signal.Signals(s).name if s else "nothing" for s in signals]
  fault = ("two processes, SIGTERM to both" if sent == ["SIGTERM"] * 2 else
           f"two processes, {sent[0]} to process 0, {sent[1]} to process 1")
  return {"fault": fault, "times": 1,
          "outcome": f"exit {codes}, stopped at steps {stopped}, saved {saved[-1:]}; "
                     f"resumed from {resumed} to {step}",
          "params_equal": same_params(params, expected), "steps_lost_max": 0,
          "exit_codes": codes, "stopped_at": stopped, "exit_s": exit_s,
          "agreed": len(set(stopped)) == 1 and stopped[0] is not None,
          "saved_stop_step": stopped[0] in saved}


def interrupted_one(workdir: Path, steps: int, expected) -> dict:
  """Ctrl-C in one process's terminal only: SIGINT to process 1."""
  return preempted(workdir, steps, expected, signals=(None, signal.SIGINT))


def lost_coordinator(workdir: Path, steps: int, expected) -> dict:
  """kill -9 of process 0, which hosts jax.distributed's coordination service: jax
  ends the others itself (recorded as it is: exit status, native stack lines)."""
  def describe(log):
    native = len(re.findall(r"^\s*@\s+0x", log, re.MULTILINE))
    return f"{native} native stack lines", {
        "survivor_native_stack_lines": native,
        "survivor_fatal_lines": [line[:300] for line in log.splitlines()
                                 if line.startswith("F1") or line.startswith("error:")]}
  return _killed_peer(workdir, steps, expected, 0,
                      "two processes, kill -9 of process 0 (the coordinator)", describe)


def two_process_faults(tmp: Path, steps: int) -> list[dict]:
  """The two-process scenarios, each against one uninterrupted two-process run."""
  reference = tmp / "two_reference"
  reference.mkdir()
  for i, p in enumerate(two_processes(reference, steps, reference)):
    assert p.wait(timeout=900) == 0, (reference / f"process{i}.log").read_text()[-3000:]
  _, expected = final_params(reference)
  rows = []
  for scenario in (lost_process, killed_while_saving, lost_coordinator, preempted,
                   interrupted_one):
    workdir = tmp / scenario.__name__
    workdir.mkdir()
    started = time.time()
    rows.append(scenario(workdir, steps, expected))
    rows[-1]["scenario_s"] = time.time() - started
    print(rows[-1]["fault"], "->", rows[-1]["outcome"], flush=True)
  return rows


def main():
  flags = parser(__doc__)
  flags.add_argument("--kills", type=int, default=5,
                     help="kill -9 the interrupted run this many times")
  flags.add_argument("--steps", type=int, default=80, help="training steps of each run")
  flags.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
  flags.add_argument("--two_process", action=argparse.BooleanOptionalAction, default=True,
                     help="also the two-process scenario (a process lost)")
  args = flags.parse_args()
  code = provenance.git_commit()  # The code that runs, taken before it runs.
  rng = random.Random(args.seed)
  env = dict(os.environ, XLA_FLAGS="")
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    reference = run(command(tmp / "reference", args.steps), env)
    assert reference.returncode == 0, reference.stderr
    _, expected = final_params(tmp / "reference")

    # 1. kill -9 at random moments, then run to the end.
    workdir = tmp / "killed"
    lost, moments = [], []
    # Each kill once this launch has logged a step (not an earlier launch: that would
    # kill every relaunch while it starts) at or past a drawn step later than the last
    # kill's, then up to 0.5 s more (stepping, saving, evaluating: a tiny step takes
    # a few ms, so longer would carry a run past the next kills' steps to its end).
    targets = sorted(rng.sample(range(5, args.steps - 10, 5), args.kills))
    for target in targets:
      log = tmp / "kill.log"
      with open(log, "w") as stderr:
        before = len(steps_logged(workdir))
        process = subprocess.Popen(command(workdir, args.steps), env=env,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
        while process.poll() is None:
          logged = steps_logged(workdir)
          if len(logged) > before and logged[-1] >= target:
            break
          time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        process.send_signal(signal.SIGKILL)
        process.wait()
      lines = [line for line in log.read_text().splitlines() if "loop.py" in line]
      moments.append(lines[-1].split("] ", 1)[-1][:40] if lines else "starting up")
      saved = Checkpointer(workdir, read_only=True).steps()
      reached = last_step_logged(workdir)
      lost.append(max(0, reached - (saved[-1] if saved else 0)))
    print("kill -9 moments (last log line before each kill):", *moments, sep="\n  ")
    finish = run(command(workdir, args.steps), env)
    step, params = final_params(workdir)
    rows.append({"fault": "kill -9 at random moments", "times": args.kills,
                 "outcome": f"exit {finish.returncode}, final step {step}",
                 "params_equal": same_params(params, expected),
                 "steps_lost_max": max(lost) if lost else 0, "moments": moments})

    # 2. SIGTERM: checkpoint, exit 0, resume.
    workdir = tmp / "sigterm"
    process = subprocess.Popen(command(workdir, args.steps), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while last_step_logged(workdir) < 10 and process.poll() is None:
      time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate()
    stopped_at = Checkpointer(workdir, read_only=True).steps()
    finish = run(command(workdir, args.steps), env)
    step, params = final_params(workdir)
    rows.append({"fault": "SIGTERM", "times": 1,
                 "outcome": f"exit {process.returncode}, saved {stopped_at[-1:]}, resumed to "
                            f"{step}", "params_equal": same_params(params, expected),
                 "steps_lost_max": 0})

    # 3. The newest checkpoint truncated: fall back to the previous one, warn.
    workdir = tmp / "truncated"
    run(command(workdir, 30), env)
    newest = Path(workdir) / "checkpoints" / "30" / "state"
    for f in newest.rglob("*"):
      if f.is_file() and f.stat().st_size > 0 and "metadata" not in f.name:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    finish = run(command(workdir, args.steps), env)
    warned = "cannot be loaded" in finish.stderr
    step, params = final_params(workdir)
    rows.append({"fault": "newest checkpoint truncated", "times": 1,
                 "outcome": f"exit {finish.returncode}, warned={warned}, final step {step}",
                 "params_equal": same_params(params, expected), "steps_lost_max": 10})

    # 4. Two processes: one lost mid-run, one lost mid-save, both preempted. A lost
    # process ends the survivor fast with one line naming it; a preemption saves one
    # agreed step; relaunching both resumes bit-exactly.
    if args.two_process:
      rows.extend(two_process_faults(tmp, args.steps))

  print_table(rows, ["fault", "times", "outcome", "params_equal", "steps_lost_max"])
  write_json(args.json, {"rows": rows, "steps": args.steps, "seed": args.seed,
                         "command": bench_command(),
                         **code})


if __name__ == "__main__":
  main()
