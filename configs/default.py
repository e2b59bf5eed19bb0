"""Defaults shared by every config: the paper's base model on WMT14 EN-DE.

Every key is documented here; other configs change only what differs.
Override any key on the command line: `--config.num_train_steps=1000`,
`--config.model.d_ff=4096`.
"""

import ml_collections

from flax_transformer import compilation
from flax_transformer.network.config import TransformerConfig
from flax_transformer.translation.search_config import SearchConfig


def model_config(**changes) -> ml_collections.ConfigDict:
  """`config.model`: exactly the fields of `TransformerConfig` (defaults: paper base)."""
  return ml_collections.ConfigDict(TransformerConfig(**changes).to_dict())


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  # --- Data ---------------------------------------------------------------
  # tfds builder name ('wmt14_translate/de-en', any '*_translate'), 'multi30k'
  # (the project's own loader), or 'text' (source/target files below).
  config.dataset_name = "wmt14_translate/de-en"
  config.eval_dataset_name = ""  # '' = same as dataset_name.
  config.train_split = "train"
  config.eval_split = "validation"
  config.test_split = "test"  # Decoded only when test_bleu_every_steps > 0.
  config.source_lang = "en"
  config.target_lang = "de"
  config.data_dir = ""  # tfds data dir ('' = tfds default, ~/tensorflow_datasets).
  # Local copy of the raw files: multi30k's .gz files; for tfds builders, the
  # downloads under their file names (WMT: the statmt.org archives), tfds's manual_dir.
  config.manual_dir = ""
  # multi30k: a folder read in place of fetching each raw .gz file it holds; unlike
  # manual_dir, one that lacks them is passed over (they are fetched, as the log says).
  config.local_copy = ""
  # 'text' dataset: line-aligned files (plain or .gz), one sentence per line.
  config.train_source_file = ""
  config.train_target_file = ""
  config.eval_source_file = ""
  config.eval_target_file = ""
  # Put before every source text of training and evaluation, before tokenizing: a
  # multilingual model's target-language tag ('>>fra<< ', OPUS-MT), as its users type it
  # at decoding. '' = none.
  config.source_prefix = ""
  # One model for every direction between these codes ('en,de,fr': six directions; '' =
  # the one pair above): a shared vocabulary keeping each target's token ('<2de>') whole,
  # the token starting each target (forced at translation: run.json's "languages" record,
  # target_by 'decoder_prefix'), directions mixed in every batch (data.multilingual).
  config.languages = ""
  # Directions sampled in proportion to their pairs ** (1 / pair_temperature): 1 = the
  # corpora's proportions, larger = closer to uniform (Arivazhagan et al. 2019 use 5).
  config.pair_temperature = 1.0

  # --- Vocabulary (one sentencepiece model shared by source and target) ---
  config.vocab_path = ""  # Existing .model file; '' = train one into the workdir.
  config.vocab_size = ml_collections.FieldReference(37000)  # Paper: ~37k shared BPE.
  config.vocab_model_type = "bpe"  # sentencepiece model type: 'bpe' | 'unigram'.
  config.vocab_max_sentences = 2_000_000  # Sentence pairs read to train the vocabulary.
  config.vocab_character_coverage = 1.0
  # Subword regularisation of training pairs (never of evaluation or decoding): each
  # pair is segmented afresh every epoch, dropping BPE merges with this probability
  # (BPE-dropout; for 'unigram', the sampling smoothing alpha). 0 = off (paper).
  config.subword_sampling_alpha = 0.0

  # --- Batching -----------------------------------------------------------
  config.max_source_length = 256  # Training pairs longer than this are filtered.
  config.max_target_length = 256
  # Token slots per side per batch (rows = batch_tokens // max_target_length). The
  # paper counts real tokens (~25k source + ~25k target); with packing, pairs fill
  # the slots (>= 90% real tokens, tests/test_data.py; 92.5% on Multi30k,
  # results/bench/input_pipeline.json), so the two agree to within that. Without packing,
  # rows are padded.
  config.batch_tokens = 25_000
  # > 0: fixed batches of per_device_batch_size rows per data-parallel device
  # (instead of batch_tokens // max_target_length rows).
  config.per_device_batch_size = 0
  config.packing = True  # Pack several pairs into one row (segment ids, positions).
  config.eval_batch_tokens = 8192
  # Evaluation and BLEU batches take at most this many row widths, so at most this
  # many compiled shapes each (every compile is logged, with its time).
  config.eval_max_shapes = 4
  # Input pipeline: processes forming training batches (-1 = one per 2 cores, at most 8,
  # on hosts of 8+ cores, else 0 = in this process; pipeline.auto_workers), and batches
  # placed on the devices ahead of the step that uses them (0 = none).
  config.data_workers = -1
  config.prefetch_batches = 2
  # Corpora of more than 1M pairs are tokenized once into a memory-mapped cache here
  # ('' = ~/.cache/flax_transformer/tokens; local disk, about 2 bytes a token).
  config.token_cache_dir = ""

  # --- Model (paper base) -------------------------------------------------
  config.model = model_config()
  config.model.vocab_size = config.get_ref("vocab_size")

  # --- Fine-tuning -------------------------------------------------------
  # A workdir (trained here, or written by import_model.py) whose newest checkpoint this
  # run starts from; '' = initialise afresh. The run keeps that workdir's vocabulary
  # (copied, never trained) and model config: of config.model only the per-run fields
  # (dropout rates, dtype, attention implementation) apply, and an override of any other
  # that differs is refused. The optimizer state is new (step 0, warmup from the start);
  # the data is this config's. A relaunch resumes from the run's own checkpoints.
  config.init_from = ""

  # --- Optimisation (paper section 5.3) ----------------------------------
  config.num_train_steps = 100_000
  config.warmup_steps = 4000
  # lrate = learning_rate * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
  config.learning_rate = 1.0  # Scale on the paper's schedule (1.0 = paper).
  config.adam_b1 = 0.9
  config.adam_b2 = 0.98
  config.adam_eps = 1e-9
  config.weight_decay = 0.0
  config.label_smoothing = 0.1  # eps_ls.
  config.grad_clip_norm = 0.0  # 0 = no clipping (paper).
  config.grad_accum_steps = 1
  # Backward pass of the smoothed cross entropy: 'fused' (hand-written, one pass over
  # the vocabulary; faster on CPUs and, measured, on an H100) or 'autodiff' (the
  # same values).
  config.cross_entropy_backward = "fused"
  # jax PRNG for dropout and initialisation: 'threefry2x32' (jax's default: the same
  # bits on every backend, device count and mesh), 'rbg' or 'unsafe_rbg' (jax
  # promises neither across backends or jax versions; unsafe_rbg's derived keys
  # carry no guarantee of independence). On an H100 neither was faster than
  # threefry (BENCHMARKS.md).
  config.prng_impl = "threefry2x32"

  # --- Loop, checkpoints, evaluation -------------------------------------
  config.seed = 0
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.num_eval_steps = -1  # -1 = the whole eval split.
  config.bleu_every_steps = 5000  # Beam-search BLEU on the eval split; 0 = never.
  config.num_bleu_sentences = -1  # -1 = all.
  # BLEU on test_split as well, for time-to-quality reports only (never used by the
  # loop to decide anything); 0 = never.
  config.test_bleu_every_steps = 0
  config.checkpoint_every_steps = 2000
  # > 0: also save when this many minutes have passed since the last save (the paper
  # saved every 10 minutes), checked at log steps; 0 = by step count only.
  config.checkpoint_every_minutes = 0.0
  config.keep_checkpoints = 20  # Paper: average of the last 5 (base) / 20 (big).
  config.nan_policy = "stop"  # 'stop' | 'skip' on a non-finite loss.
  # > 0: a jax.profiler trace of this many steps, from step profile_first_step + 1
  # (after the compiles), written to WORKDIR/profile by process 0; TensorBoard's
  # profile plugin and Perfetto (ui.perfetto.dev) open it.
  config.profile_steps = 0
  config.profile_first_step = 10

  # --- Decoding (paper section 6.1), for BLEU during training ------------
  # Defaults: SearchConfig's (beam 4, length penalty ((5 + |Y|) / 6)^0.6, outputs
  # up to source length + 50), the one place decode.py's defaults come from too.
  search = SearchConfig()
  config.beam_size = search.beam_size
  config.alpha = search.alpha
  config.max_extra = search.max_extra

  # --- Devices ------------------------------------------------------------
  # Mesh axis sizes; -1 = all remaining devices. Product must equal the device count.
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  # Logical axis -> mesh axis (or None = replicated), as data.
  config.logical_axis_rules = (
      ("batch", ("data", "fsdp")),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("mlp", "tensor"),
      ("heads", "tensor"),
      ("kv", None),
      ("length", None),
  )
  config.peak_flops_per_device = 0.0  # For MFU in logs; 0 = not reported.
  # Compile evaluation and BLEU search for every batch shape on background threads
  # while the first train steps run, instead of at the first evaluation.
  config.compile_ahead = True
  # jax's persistent compilation cache (executables and XLA's GPU autotuning results):
  # a second launch of the same job loads its steps instead of compiling. '' = off.
  config.compilation_cache_dir = compilation.default_cache_dir()
  return config
