"""The mutation check's mutants (tools/mutants.py): each paper-critical detail, the
function that holds it, the expression or statement that is it, its broken form, and
the tests that must catch it."""

from __future__ import annotations

from typing import NamedTuple

RECIPE = "tests/test_recipe.py"
PAPER = "tests/test_paper.py"
STEPS = "flax_transformer.training.steps"
LAYERS = "flax_transformer.network.layers"
DECODER = "flax_transformer.network.model:Decoder.__call__"
ATTENTION = "flax_transformer.network.attention"
SEARCH = "flax_transformer.translation.search"
AVERAGING = "flax_transformer.averaging"
DEFAULTS = "configs.default:get_config"


class Mutant(NamedTuple):
  """One broken detail: in `target` ('module:Function.nested', or a module alone for its
  top level), the one node whose syntax tree equals `old`'s becomes `new`."""
  name: str
  target: str
  old: str  # One expression or statement, as Python (formatting and comments aside).
  new: str
  tests: tuple[str, ...]  # pytest node ids or files.


MUTANTS = [
    # --- Label smoothing (section 5.4) ---------------------------------------------
    Mutant("train step without label smoothing", f"{STEPS}:Trainer._loss_sums",
           'cross_entropy_sums(logits, batch["targets"], self.config.label_smoothing, '
           'with_accuracy=False, fused_backward=self.fused_backward, classes=self.classes)',
           'cross_entropy_sums(logits, batch["targets"], 0.0, with_accuracy=False, '
           'classes=self.classes)', (RECIPE,)),
    Mutant("smoothing mass not spread over the vocabulary (backward)",
           f"{STEPS}:_smoothed_cross_entropy_bwd", "g_loss * (label_smoothing / vocab)",
           "g_loss * label_smoothing",
           ("tests/test_training.py::test_label_smoothed_loss_gradients_match_optax",
            RECIPE)),
    Mutant("default label smoothing 0", DEFAULTS, "config.label_smoothing = 0.1",
           "config.label_smoothing = 0.0", (RECIPE,)),
    # --- Learning-rate schedule (eq. 3) ------------------------------------------
    Mutant("warmup exponent -1 instead of -1.5", f"{STEPS}:learning_rate_schedule.schedule",
           "step * warmup_steps ** -1.5", "step * warmup_steps ** -1.0",
           ("tests/test_training.py::test_schedule_is_the_papers_formula", RECIPE)),
    Mutant("schedule steps counted from 0", f"{STEPS}:learning_rate_schedule.schedule",
           "step = jnp.asarray(count, jnp.float32) + 1.0",
           "step = jnp.asarray(count, jnp.float32) + 0.5", (RECIPE,)),
    Mutant("trainer's schedule on d_ff instead of d_model", f"{STEPS}:Trainer.__init__",
           "learning_rate_schedule(model_config.d_model, config.warmup_steps, "
           "config.learning_rate)",
           "learning_rate_schedule(model_config.d_ff, config.warmup_steps, config.learning_rate)",
           (RECIPE,)),
    # --- Adam (section 5.3) ------------------------------------------------------
    Mutant("Adam beta2 0.999 in the optimiser", f"{STEPS}:make_optimizer",
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)",
           "optax.adam(schedule, b1=config.adam_b1, b2=0.999, eps=config.adam_eps)", (RECIPE,)),
    Mutant("Adam beta1 0.8 in the optimiser", f"{STEPS}:make_optimizer",
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)",
           "optax.adam(schedule, b1=0.8, b2=config.adam_b2, eps=config.adam_eps)", (RECIPE,)),
    Mutant("Adam epsilon 1e-8 in the optimiser", f"{STEPS}:make_optimizer",
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)",
           "optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=1e-8)", (RECIPE,)),
    Mutant("default Adam epsilon 1e-8", DEFAULTS, "config.adam_eps = 1e-9",
           "config.adam_eps = 1e-8", (RECIPE,)),
    Mutant("default Adam beta2 0.999", DEFAULTS, "config.adam_b2 = 0.98",
           "config.adam_b2 = 0.999", (RECIPE,)),
    Mutant("gradients not normalised per target token", f"{STEPS}:Trainer._train_step_fn",
           "grads = jax.tree_util.tree_map(lambda g: g / tokens, grads)",
           "grads = jax.tree_util.tree_map(lambda g: g / 10.0, grads)", (RECIPE,)),
    # --- Dropout (section 5.4) ---------------------------------------------------
    Mutant("train step runs the deterministic model", f"{STEPS}:Trainer.__init__",
           "Transformer(model_config.replace(deterministic=False, decode=False))",
           "Transformer(model_config.replace(deterministic=True, decode=False))", (RECIPE,)),
    Mutant("sub-layer dropout rate 0", f"{LAYERS}:SubLayer.__call__",
           "dropout = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)",
           "dropout = Dropout(0.0, deterministic=cfg.deterministic)", (PAPER, RECIPE)),
    Mutant("no dropout on the decoder's embedding sums", DECODER,
           "y = Dropout(cfg.dropout_rate, deterministic=cfg.deterministic)(y)",
           "y = Dropout(0.0, deterministic=cfg.deterministic)(y)", (PAPER, RECIPE)),
    Mutant("dropout survivors not rescaled", f"{LAYERS}:Dropout.__call__",
           "jnp.asarray(1.0 / (1.0 - self.rate), x.dtype)", "jnp.asarray(1.0, x.dtype)",
           (PAPER, "tests/test_model.py::test_dropout_mask_rate_and_scaling")),
    # --- Attention (section 3.2.1) -----------------------------------------------
    Mutant("attention logits scaled by 1/d_k (unfused path)", f"{ATTENTION}:_head_major_weights",
           "np.sqrt(d_k).astype(np.float32)", "np.float32(d_k)", ("tests/test_attention.py",)),
    Mutant("attention logits unscaled (XLA fused path)",
           f"{ATTENTION}:scaled_dot_product_attention",
           'jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")',
           'jax.nn.dot_product_attention(query, key, value, mask=mask, scale=1.0, '
           'implementation="xla")', ("tests/test_attention.py",)),
    # --- Causal decoder (section 3.2.3) ------------------------------------------
    Mutant("no causal mask in training", DECODER,
           "combine_masks(padding_mask(targets, targets), causal_mask(targets.shape[1]))",
           "combine_masks(padding_mask(targets, targets))",
           ("tests/test_model.py::test_causality",)),
    Mutant("causal mask lets each position see the next", f"{ATTENTION}:causal_mask",
           "jnp.tril(jnp.ones((length, length), dtype=bool))",
           "jnp.tril(jnp.ones((length, length), dtype=bool), 1)",
           ("tests/test_model.py::test_causality", "tests/test_attention.py")),
    Mutant("targets not shifted right", DECODER,
           "shift_right(targets, targets_segmentation)", "targets",
           ("tests/test_model.py::test_causality",)),
    # --- Embeddings and the tied projection (section 3.4) -------------------------
    Mutant("untied output projection", DECODER, "cfg.share_embeddings", "False", (PAPER,)),
    Mutant("no gradient into the embedding from the output projection",
           f"{LAYERS}:_tied_projection_bwd", "(x2.T @ g2).T", "0.0 * (x2.T @ g2).T",
           ("tests/test_model.py::test_tied_projection_gradients_match_autodiff", RECIPE)),
    Mutant("embeddings not scaled by sqrt(d_model)", f"{LAYERS}:Embedding.__call__",
           "jnp.asarray(np.sqrt(cfg.d_model), cfg.dtype)", "jnp.asarray(1.0, cfg.dtype)",
           (PAPER,)),
    Mutant("sinusoid wavelengths on i instead of 2i", f"{LAYERS}:sinusoidal_position_encoding",
           "np.arange(0, d_model, 2, dtype=np.float64)",
           "np.arange(0, d_model // 2, dtype=np.float64)",
           ("tests/test_model.py::test_sinusoidal_encoding_matches_formula", PAPER)),
    # --- Residual and normalisation (section 3.1) --------------------------------
    Mutant("pre-LN instead of the paper's post-LN", f"{LAYERS}:SubLayer.__call__",
           'return layer_norm(cfg, "norm")(x + dropout(sublayer(x)))',
           'return x + dropout(sublayer(layer_norm(cfg, "norm")(x)))', (PAPER,)),
    # --- Checkpoint averaging (section 6.1) ----------------------------------------
    Mutant("averaging divides by one more checkpoint", f"{AVERAGING}:average_params",
           "np.float32(1.0 / len(steps))", "np.float32(1.0 / (len(steps) + 1))",
           ("tests/test_reliability.py::test_average_is_the_elementwise_mean",)),
    Mutant("'average' of the first and last checkpoint only", f"{AVERAGING}:average_params",
           "for step in steps:\n"
           "  params = checkpointer.restore_params(step, abstract)\n"
           "  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)\n"
           "  total = params if total is None else jax.tree_util.tree_map(jnp.add, total, params)",
           "for step in (steps[0], steps[-1]) if len(steps) > 2 else steps:\n"
           "  params = checkpointer.restore_params(step, abstract)\n"
           "  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)\n"
           "  total = params if total is None else jax.tree_util.tree_map(jnp.add, total, params)",
           ("tests/test_reliability.py::test_average_is_the_elementwise_mean",)),
    Mutant("the oldest checkpoints averaged instead of the newest", f"{AVERAGING}:_load_params",
           "steps[-average_last:]", "steps[:average_last]",
           ("tests/test_decoding.py::test_average_checkpoints_cli_writes_a_decodable_workdir",)),
    # --- Beam search (section 6.1) ------------------------------------------------
    Mutant("length penalty (5 + |Y|) / 5", f"{SEARCH}:length_penalty",
           "(5.0 + length.astype(score_dtype())) / 6.0",
           "(5.0 + length.astype(score_dtype())) / 5.0",
           ("tests/test_decoding.py::test_beam_equals_exhaustive_search", PAPER)),
    Mutant("finished hypotheses penalised one token short", f"{SEARCH}:_keep_finished",
           "top_log_probs / length_penalty(s.step + 1, alpha)",
           "top_log_probs / length_penalty(s.step, alpha)",
           ("tests/test_decoding.py::test_beam_equals_exhaustive_search", PAPER)),
    Mutant("early stop bounds live beams at their current length",
           f"{SEARCH}:beam_search.not_done", "length_penalty(max_lengths, alpha)",
           "length_penalty(s.step + 1, alpha)", (PAPER,)),
    Mutant("no early stop", f"{SEARCH}:beam_search.not_done",
           "return (s.step < length) & jnp.any(open_sentence)", "return s.step < length",
           (PAPER,)),
    # --- Search options and forced prefixes (issue 68) -------------------------------
    Mutant("a forced prefix gets no room past the length limit", f"{SEARCH}:_max_lengths",
           "max_lengths = jnp.maximum(max_lengths, forced_lengths + 1)", "pass",
           ("tests/test_scoring.py::test_prefixes_in_beam_search_and_nbest",)),
    Mutant("alpha's range unchecked (decode.py, serve.py, the API)",
           "flax_transformer.translation.search_config:SearchConfig.__post_init__",
           "not 0 <= self.alpha <= MAX_ALPHA", "False",
           ("tests/test_serve.py::test_bad_input_gets_a_4xx_with_one_line_and_one_log_line",)),
    # --- A zero start vector (start_from_zero_embedding: Marian-NMT, CTranslate2) -----
    Mutant("the zero start embeds padding's row", DECODER,
           "embedded = jnp.where((decoder_inputs == 0)[..., None], 0, embedded)",
           "embedded = embedded",
           ("tests/test_model.py::test_start_from_zero_embedding_never_reads_row_0",)),
    Mutant("padding's logit keeps its row under a zero start", DECODER,
           "logits = jnp.where(jnp.arange(logits.shape[-1]) == 0, 0, logits)",
           "logits = logits",
           ("tests/test_model.py::test_start_from_zero_embedding_never_reads_row_0",)),
]
