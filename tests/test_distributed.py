"""Several processes: what a failure in one of them is reported as, and how soon."""

import logging
import subprocess
import sys

import jax
import pytest

from conftest import ROOT, cpu_env, free_port
from flax_transformer.training import distributed

# One process of a two-process jax.distributed run on this host: `work` fails with a real
# device out-of-memory (a 512 TiB buffer), in both processes, inside run_watched.
OUT_OF_MEMORY = """
import sys, time
import jax, jax.numpy as jnp
from flax_transformer.training import distributed

distributed.initialize(f"localhost:{sys.argv[1]}", 2, int(sys.argv[2]))
failed = []
def work():
  failed.append(time.monotonic())
  jnp.zeros(2**47, jnp.float32).block_until_ready()
try:
  distributed.run_watched(work)
except jax.errors.JaxRuntimeError as e:
  print(f"raised after {time.monotonic() - failed[0]:.1f} s: {str(e).splitlines()[0]}")
"""


def test_out_of_memory_is_raised_at_once_in_several_processes():
  """A device out-of-memory is this process's own failure: raised as itself, not held for
  the ~34 s (heartbeat timeout and two polls) that a failed collective waits for a peer's
  loss to show."""
  port = str(free_port())
  processes = [subprocess.Popen([sys.executable, "-c", OUT_OF_MEMORY, port, str(i)],
                                cwd=ROOT, env=cpu_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in processes:
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr[-2000:]
    assert "RESOURCE_EXHAUSTED: Out of memory" in stdout, stderr[-2000:]
    assert "lost process" not in stderr
    held = float(stdout.split("raised after ")[1].split(" s")[0])
    assert held < distributed.HEARTBEAT_TIMEOUT_S / 3, stdout


@pytest.mark.parametrize("client", [object(), type("OldClient", (), {
    "get_live_nodes": lambda self: [0, 1]})()], ids=["no_get_live_nodes", "other_signature"])
def test_a_changed_jax_client_is_not_a_lost_process(client, monkeypatch, caplog):
  """jax.distributed's client is private API: when it lacks get_live_nodes
  (AttributeError) or takes other arguments (TypeError), the watch stops with a warning
  instead of reporting process 0 lost and ending the run."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed, "_client", lambda: client)
  reported = []
  monkeypatch.setattr(distributed, "_exit_lost", lambda lost, detail: reported.append(lost))
  with pytest.raises((AttributeError, TypeError)):
    distributed._lost_peers()  # noqa: SLF001
  polls = iter(range(3))
  monkeypatch.setattr(distributed, "PEER_POLL_S", 0.0)
  with caplog.at_level(logging.WARNING):
    distributed._exit_when_a_peer_is_lost(lambda: next(polls, None) is not None)  # noqa: SLF001
  assert reported == []
  assert "Not watching for lost processes" in caplog.text


def test_only_out_of_memory_skips_the_wait_for_a_lost_peer():
  assert distributed.is_out_of_memory(jax.errors.JaxRuntimeError(
      "RESOURCE_EXHAUSTED: Out of memory allocating 562949953421312 bytes."))
  # What a collective whose peer died may say: still checked against the peers.
  assert not distributed.is_out_of_memory(jax.errors.JaxRuntimeError(
      "UNAVAILABLE: failed to connect to all addresses"))
  assert not distributed.is_out_of_memory(MemoryError("host"))
