"""The flags decode.py, serve.py and export.py share, each defined once here.

Which checkpoints to load (--average_last, --checkpoint_step), the CPU devices a
batch is split over (--cpu_devices) and the search options (--beam_size, --alpha,
--max_extra; their one check is `SearchConfig`'s). A script calls
`define_model_flags()` and `define_search_flags()` at its top and builds its
search with `search_config(...)`. Imports no JAX: flags are defined before it loads.
"""

from absl import flags

from flax_transformer.translation.search_config import SearchConfig

SEARCH = SearchConfig()  # The defaults.
# --average_last's help; its default is None (averaging.load_params: the last 5, or as
# many as the workdir holds, quietly). tools/results.py's --average_last shares both.
AVERAGE_LAST_HELP = (
    "Average the parameters of the last K checkpoints, as the paper did (5 for base, 20 for "
    "big); fewer, with a warning, where the workdir holds fewer. 1 = the newest checkpoint "
    "alone. Default: the last 5, or all the workdir holds where fewer (an imported model's "
    "one).")


def define_model_flags(cpu_devices_help: str = "") -> None:
  """--average_last, --checkpoint_step and --cpu_devices (what to load, and where)."""
  flags.DEFINE_integer("average_last", None, AVERAGE_LAST_HELP)
  flags.DEFINE_integer("checkpoint_step", None, "Use this checkpoint step (default: newest).")
  flags.DEFINE_integer("cpu_devices", 0, "On a CPU host: XLA devices to split each batch over, "
                       "one search each (0 = one per core). An "
                       "--xla_force_host_platform_device_count in XLA_FLAGS wins."
                       + (" " + cpu_devices_help if cpu_devices_help else ""), lower_bound=0)


def define_search_flags(beam_size_help: str = "Beam width (paper: 4); 1 = greedy.") -> None:
  """--beam_size, --alpha and --max_extra, their defaults `SearchConfig`'s."""
  flags.DEFINE_integer("beam_size", SEARCH.beam_size, beam_size_help)
  flags.DEFINE_float("alpha", SEARCH.alpha,
                     "Length penalty exponent, ((5 + |Y|) / 6)^alpha (paper: 0.6).")
  flags.DEFINE_integer("max_extra", SEARCH.max_extra, "Longest output = source length + "
                       "max_extra tokens (paper: 50), capped by the model's max_len.")


def search_config(**more) -> SearchConfig:
  """The search the flags ask for (`more`: a script's own options, as nbest)."""
  values = flags.FLAGS
  return SearchConfig(beam_size=values.beam_size, alpha=values.alpha,
                      max_extra=values.max_extra, **more)
