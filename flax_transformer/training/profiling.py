"""A jax.profiler trace of a few training steps, for TensorBoard and Perfetto."""

from __future__ import annotations

import logging
import shutil

import jax

from flax_transformer import storage
from flax_transformer import workdir as workdir_lib


class Profile:
  """A jax.profiler trace of config.profile_steps steps of this launch (process 0).

  The trace starts after config.profile_first_step steps (past the compiles) and
  goes to WORKDIR/profile, where TensorBoard's profile plugin and Perfetto find it.
  """

  def __init__(self, config, workdir: workdir_lib.Workdir, start_step: int):
    self.first = start_step + config.profile_first_step
    self.last = self.first + config.profile_steps
    self.wanted = config.profile_steps > 0 and jax.process_index() == 0
    self.directory, self.tracing = workdir.profile, False

  def before(self, step: int) -> None:
    if self.wanted and step == self.first:
      # jax's profiler writes local files only: a bucket's trace is uploaded at the end.
      self.local = storage.local_staging_dir(self.directory, prefix="profile-")
      jax.profiler.start_trace(self.local)
      self.tracing = True

  def after(self, step: int, state, stopping: bool = False) -> None:
    if self.tracing and (step >= self.last or stopping):
      jax.block_until_ready(state)  # The traced steps' device work, whole.
      jax.profiler.stop_trace()
      storage.upload_tree(self.local, self.directory)
      if storage.is_remote(self.directory):
        shutil.rmtree(self.local, ignore_errors=True)
      self.tracing, self.wanted = False, False
      logging.info("Profile of steps %d-%d written to %s", self.first + 1, step, self.directory)
