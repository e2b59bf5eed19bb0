"""The host this process runs on."""

import os
import platform


def usable_cores() -> int:
  """Cores this process may use (its affinity on Linux; all cores elsewhere)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def cpu_model() -> dict:
  """Model name, clock (MHz) and widest vector ISA from /proc/cpuinfo (Linux), else {}.

  Hosts of the same kind differ (the float32 matmul peak has been 150 and 340
  GFLOP/s on two of them): this tells which one produced a result.
  """
  try:
    with open("/proc/cpuinfo") as f:
      fields = dict(line.split(":", 1) for line in f if ":" in line)
  except OSError:
    return {}
  fields = {k.strip(): v.strip() for k, v in fields.items()}
  flags = fields.get("flags", "").split()
  isa = next((x for x in ("avx512f", "avx2", "avx") if x in flags), "")
  return {"cpu_model": fields.get("model name", ""), "cpu_mhz": fields.get("cpu MHz", ""),
          "cpu_vector_isa": isa}


def describe() -> dict:
  """The machine, for records: OS, CPU, usable cores (accelerators: `provenance`)."""
  return {"system": platform.platform(), "cpu": platform.processor() or platform.machine(),
          **cpu_model(), "usable_cores": usable_cores()}
