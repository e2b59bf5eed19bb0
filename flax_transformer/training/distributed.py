"""Several processes (one per host) as one run: joining, a lost peer, leaving (what they
agree on: `flax_transformer.collectives`).

jax.distributed connects the processes; its coordination service (hosted by
process 0) is asked here which peers are alive, so that a lost process ends the
others at once with one line instead of a hang and a native stack dump. A
preemption (SIGTERM) is agreed on through jax.distributed's preemption sync point,
which orbax's CheckpointManager exposes (`Checkpointer.reached_preemption`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import jax

from flax_transformer import errors

# How long a silent process counts as alive (jax.distributed's heartbeat timeout; jax's
# default is 100 s), and how often this process asks which peers are alive.
HEARTBEAT_TIMEOUT_S = 30
PEER_POLL_S = 2.0


def initialize(coordinator_address: str | None, num_processes: int | None,
               process_id: int | None) -> None:
  """Joins a multi-process run (one process per host).

  With `coordinator_address`, as given. Without it, jax.distributed's own cluster
  detection (Cloud TPU VM slices, SLURM, Open MPI, Kubernetes JobSets) supplies
  the address, process count and index; where it finds no cluster the run is a
  single process.
  """
  if jax.config.jax_platforms in (None, "", "cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # A lost process is then reported to the others (`_exit_when_a_peer_is_lost`), not fatal to them.
  if hasattr(jax.config, "jax_enable_recoverability"):  # jax 0.7.1 lacks it.
    jax.config.update("jax_enable_recoverability", True)
  options = dict(num_processes=num_processes, process_id=process_id,
                 heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  if coordinator_address:
    jax.distributed.initialize(coordinator_address=coordinator_address, **options)
    return
  if jax.distributed.is_initialized():
    return
  try:
    jax.distributed.initialize(**options)
  except ValueError as e:
    # jax's words when no cluster was detected and nothing was given.
    if "coordinator_address should be defined" not in str(e):
      raise
    logging.info("No cluster detected (jax.distributed): running as a single process")
    return
  except RuntimeError as e:
    # Called in-process after JAX already started (a notebook, a test): too late to join.
    if "must be called before" not in str(e):
      raise
    logging.info("JAX already started in this process: running as a single process")
    return
  logging.info("Cluster detected by jax.distributed: process %d of %d", jax.process_index(),
               jax.process_count())


def run_watched(work: Callable[[], None]) -> None:
  """Runs `work()` on every process of a multi-process run, ending all of them with one
  line once a peer is lost, and leaving jax.distributed in an order that cannot abort
  the others. A single process just runs `work()`."""
  if jax.process_count() == 1:
    work()
    return
  running = threading.Event()
  running.set()
  threading.Thread(target=_exit_when_a_peer_is_lost, args=(running.is_set,), name="peer_watch",
                   daemon=True).start()
  try:
    work()
  except BaseException as e:
    if (isinstance(e, (jax.errors.JaxRuntimeError, errors.CheckpointSaveError))
        and not is_out_of_memory(e)):
      # A collective failed: most likely a peer died. Say so rather than the error.
      deadline = time.monotonic() + HEARTBEAT_TIMEOUT_S + 2 * PEER_POLL_S
      _exit_when_a_peer_is_lost(lambda: time.monotonic() < deadline)
    _leave(running, timeout_s=30.0)  # Errors raised everywhere (a bad config) leave too.
    raise
  _leave(running, barrier=True)


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's out-of-memory (status RESOURCE_EXHAUSTED): this process's own
  failure, raised at once rather than held while the peers are checked."""
  return isinstance(error, jax.errors.JaxRuntimeError) and (
      str(error).startswith("RESOURCE_EXHAUSTED") or "Out of memory" in str(error))


def wait_at_barrier(name: str, timeout_s: float = 24 * 3600) -> None:
  """Returns once every process has called it with `name` (jax.distributed's barrier);
  the default waits out a long wait, such as process 0 fetching WMT's GBs."""
  _client().wait_at_barrier(name, int(timeout_s * 1000))


def enter_together(name: str) -> None:
  """Before the run's first collective (the first train step): every process waits here
  until all have compiled their steps, then all enter it at once. A no-op in one process.

  On CPUs a clique's first collective sets up gloo's connections, and each process waits
  at most 30 s for its peers there (checked: "Gloo context initialization failed:
  DEADLINE_EXCEEDED: GetKeyValue() timed out ... 29.99s"). The failure sits unread in
  the step's outputs while that process goes on to its next collective, and the processes
  then wait on each other forever. One process can easily arrive 30 s early: jax's
  persistent cache serves only process 0 on CPUs (its key holds each process's own
  topology, and only process 0 writes), so on a relaunch process 0 loads its steps in
  seconds while the others compile theirs (issue 57).
  """
  if jax.process_count() == 1:
    return
  start = time.monotonic()
  wait_at_barrier(name)
  logging.info("All %d processes ready for the first step (waited %.1f s for the others)",
               jax.process_count(), time.monotonic() - start)


def _client():
  return jax._src.distributed.global_state.client  # noqa: SLF001 (no public API)


def _leave(running: threading.Event, barrier: bool = False, timeout_s: float = 600.0) -> None:
  """Leaves jax.distributed with process 0 (the coordination service's host) last.

  In recoverable mode jax.distributed's own shutdown barrier does not wait, so a
  process that left first would stop the service under the others' feet (a native
  abort in theirs). `barrier`: first wait until every process is done.
  """
  client = _client()
  if barrier:
    client.wait_at_barrier("flax_transformer_done", int(timeout_s * 1000))
  running.clear()  # Peers leaving from here is no loss.
  if jax.process_index() != 0:
    jax.distributed.shutdown()
    return
  everyone = list(range(jax.process_count()))
  deadline = time.monotonic() + timeout_s
  while set(client.get_live_nodes(everyone)) - {0} and time.monotonic() < deadline:
    time.sleep(0.2)
  jax.distributed.shutdown()


def _exit_when_a_peer_is_lost(keep_watching: Callable[[], bool]) -> None:
  """Exits this process, with one line, once a peer process is gone; returns when
  `keep_watching()` turns false first.

  A collective whose peer died never completes, and jax.distributed would end the
  survivors itself only after its heartbeat timeout, with a native stack dump (or,
  had the collective failed, they would wait in its shutdown barrier as long). Here
  the coordination service (recoverable mode: it reports a dead task instead of
  aborting everyone) is asked every PEER_POLL_S which processes are alive. A client
  that lacks the call or takes other arguments (jax's private API changed) ends the
  watch with a warning: that is no lost process.
  """
  while keep_watching():
    try:
      lost, detail = _lost_peers()
    except (AttributeError, TypeError) as e:
      logging.warning("Not watching for lost processes: jax.distributed's client no longer "
                      "answers get_live_nodes as expected (%s: %s)", type(e).__name__, e)
      return
    if lost and keep_watching():
      _exit_lost(lost, detail)
    time.sleep(PEER_POLL_S)


def _lost_peers() -> tuple[list[int], str]:
  """The processes the coordination service no longer counts as alive, and why.

  Only the client's own error (JaxRuntimeError: the service, on process 0, is
  unreachable) means process 0 is lost; anything else propagates.
  """
  everyone = list(range(jax.process_count()))
  client = _client()
  try:
    return sorted(set(everyone) - set(client.get_live_nodes(everyone))), "no heartbeat"
  except jax.errors.JaxRuntimeError as e:
    return [0], (str(e).splitlines()[0][:200] if str(e) else type(e).__name__)


def _exit_lost(lost: list[int], detail: str) -> None:
  errors.report(f"process {jax.process_index()} of {jax.process_count()}: lost process "
                f"{', '.join(map(str, lost))} ({detail}); stopping. Relaunch every process: "
                "training resumes from the last complete checkpoint.")
  os._exit(errors.EXIT_FAILED)  # Not sys.exit: the train step may hang in a collective.
