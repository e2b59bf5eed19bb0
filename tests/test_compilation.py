"""The XLA flags the entry points default to, and how a user's own flags win."""

import pytest

from flax_transformer import compilation

from conftest import compile_threads_busy


def test_default_flags_are_added_once_and_a_users_value_wins():
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  added = compilation.set_default_xla_flags(environ)
  assert added == ["--xla_gpu_enable_triton_gemm=false"]
  assert environ["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                                  "--xla_gpu_enable_triton_gemm=false")
  assert compilation.set_default_xla_flags(environ) == []  # A second call adds nothing.

  environ = {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true"}
  assert compilation.set_default_xla_flags(environ) == []
  assert environ["XLA_FLAGS"] == "--xla_gpu_enable_triton_gemm=true"

  environ = {}
  compilation.set_default_xla_flags(environ)
  assert environ["XLA_FLAGS"] == "--xla_gpu_enable_triton_gemm=false"


def test_compile_ahead_compiles_once_in_the_background_and_counts_against_the_cap():
  import jax
  import jax.numpy as jnp
  import numpy as np

  per_shape = compilation.PerShape(jax.jit(lambda x: x * 2 + 1), "Doubling", max_shapes=2,
                                   describe=lambda x: f"x {list(x.shape)}")
  per_shape.compile_ahead(jax.ShapeDtypeStruct((3, 4), jnp.float32))
  per_shape.compile_ahead(jax.ShapeDtypeStruct((3, 4), jnp.float32))  # Already under way.
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  np.testing.assert_array_equal(np.asarray(per_shape(x)), x * 2 + 1)
  assert list(per_shape.compile_seconds) == ["x [3, 4]"]  # One compile, ahead of the call.
  per_shape.compile_ahead(jax.ShapeDtypeStruct((5,), jnp.float32))
  with pytest.raises(RuntimeError, match="beyond the cap of 2"):
    per_shape(np.zeros(7, np.float32))  # The pending shape holds the second place.
  np.testing.assert_array_equal(np.asarray(per_shape(np.ones(5, np.float32))), np.full(5, 3.0))
  assert per_shape.num_shapes == 2


def test_a_failed_setup_drops_the_compiles_it_queued():
  """train.py queues its compiles at setup; if setup then fails, the process must not sit
  through every queued program before exiting (loop.setup_run calls cancel_queued)."""
  import jax
  import jax.numpy as jnp

  with compile_threads_busy():  # What follows stays queued.
    per_shape = compilation.PerShape(jax.jit(lambda x: x + 1), "Queued")
    for n in range(3, 3 + 8):
      per_shape.compile_ahead(jax.ShapeDtypeStruct((n,), jnp.float32))
    compilation.cancel_queued()
  assert all(f.cancelled() for f in per_shape._pending.values())
  assert per_shape.compile_seconds == {}  # None of them compiled.
  # A shape whose compile was dropped compiles when it is called (in this process, a
  # translator may outlive a failed setup).
  assert float(per_shape(jnp.ones(3))[0]) == 2.0
  # Later compiles get a new executor.
  per_shape.compile_ahead(jax.ShapeDtypeStruct((2,), jnp.float32))
  assert float(per_shape(jnp.ones(2))[0]) == 2.0
