"""The XLA flags the entry points default to, and how a user's own flags win."""

import pytest

from flax_transformer import compilation


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
