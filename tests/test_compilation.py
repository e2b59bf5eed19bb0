"""The XLA flags the entry points default to, and how a user's own flags win."""

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
