"""The training model: loss, optimiser, sharded train/eval steps (paper section 5).

`Trainer` holds what is compiled once per run: the jitted, sharded train and
eval steps and the state's shardings. The loop that feeds it lives in `loop`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from flax_transformer import compilation
from flax_transformer.network.config import TransformerConfig
from flax_transformer.network.model import Transformer
from flax_transformer.pretrained import vocab_padding
from flax_transformer.training import distributed
from flax_transformer.training import sharding as sharding_lib

MODEL_INPUT_KEYS = ("inputs", "targets", "inputs_positions", "targets_positions",
                    "inputs_segmentation", "targets_segmentation")


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 [], optimiser updates applied so far.
  params: Any
  opt_state: Any


def learning_rate_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (paper eq. 3).

  optax counts updates from 0; the paper's step numbers start at 1.
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
  return schedule


def make_optimizer(config, schedule: optax.Schedule) -> optax.GradientTransformation:
  """Adam(beta1, beta2, eps) on the paper's schedule; optional clipping and weight decay."""
  parts = []
  if config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  if config.weight_decay > 0:
    parts.append(optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                             eps=config.adam_eps, weight_decay=config.weight_decay))
  else:
    parts.append(optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps))
  return optax.chain(*parts)


def cross_entropy_sums(logits: jax.Array, targets: jax.Array, label_smoothing: float,
                       with_accuracy: bool = True, fused_backward: bool = True,
                       classes: int | None = None) -> dict[str, jax.Array]:
  """Sums over non-pad target tokens of the smoothed loss, NLL and correct predictions.

  logits float32 [B, T, V], targets int [B, T]. Label smoothing puts eps_ls / V
  on every class and 1 - eps_ls on the true one (Szegedy et al., paper 5.4):
  loss = (1 - eps_ls) * NLL + eps_ls * mean_v(-log p_v). Accuracy (an argmax
  over the vocabulary) is optional: it is a visible cost in a CPU train step.
  `fused_backward`: the hand-written backward pass (`smoothed_cross_entropy`),
  else autodiff's (the same values; which is faster depends on the device).
  `classes`: the real classes, the first ids (default all V); a padded vocabulary's
  rows after them (config.vocab_padding, logits -inf) get no smoothing mass, V
  counting only the real ones.
  """
  weights = (targets != 0).astype(jnp.float32)
  loss, nll = (smoothed_cross_entropy if fused_backward else autodiff_cross_entropy)(
      logits, targets, label_smoothing, logits.shape[-1] if classes is None else classes)
  sums = {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights),
          "tokens": jnp.sum(weights)}
  if with_accuracy:
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    sums["correct"] = jnp.sum(correct * weights)
  return sums


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def smoothed_cross_entropy(logits: jax.Array, targets: jax.Array, label_smoothing: float,
                           classes: int) -> tuple[jax.Array, jax.Array]:
  """logits [..., V], targets int [...] -> (smoothed loss, NLL), each [...] float32;
  the smoothing spread over the first `classes` ids."""
  return _smoothed_cross_entropy_fwd(logits, targets, label_smoothing, classes)[0]


def _mean_over_classes(log_probs: jax.Array, classes: int) -> jax.Array:
  """mean_v(log p_v) over the first `classes` ids: a padded vocabulary's -inf rows left out."""
  if classes == log_probs.shape[-1]:
    return jnp.mean(log_probs, axis=-1)
  real = jnp.arange(log_probs.shape[-1]) < classes
  return jnp.sum(jnp.where(real, log_probs, 0.0), axis=-1) / classes


def _smoothed_cross_entropy_fwd(logits, targets, label_smoothing, classes):
  log_probs = jax.nn.log_softmax(logits)  # Once, for both terms.
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  loss = (1.0 - label_smoothing) * nll - label_smoothing * _mean_over_classes(log_probs, classes)
  return (loss, nll), (log_probs, targets)


def _smoothed_cross_entropy_bwd(label_smoothing, classes, residuals, cotangents):
  # d loss / d logits = p - (1 - eps_ls) onehot - eps_ls / V and d NLL = p - onehot,
  # in one pass over [..., V], instead of autodiff's scatter of a one-hot into
  # zeros and separate passes (BENCHMARKS.md). V: the real classes; a padded row's
  # p is 0 and it gets no eps_ls / V, so its gradient is 0.
  log_probs, targets = residuals
  g_loss, g_nll = (g[..., None] for g in cotangents)
  vocab = classes
  ids = jnp.arange(log_probs.shape[-1])
  is_target = ids == targets[..., None]
  d_logits = ((g_loss + g_nll) * jnp.exp(log_probs)
              - jnp.where(is_target, g_loss * (1.0 - label_smoothing) + g_nll, 0.0)
              - _on_classes(g_loss * (label_smoothing / vocab), ids, classes))
  return d_logits, None


def _on_classes(spread: jax.Array, ids: jax.Array, classes: int) -> jax.Array:
  """`spread` on the first `classes` ids, 0 on a padded vocabulary's rows after them."""
  return spread if classes == ids.shape[0] else jnp.where(ids < classes, spread, 0.0)


smoothed_cross_entropy.defvjp(_smoothed_cross_entropy_fwd, _smoothed_cross_entropy_bwd)


CROSS_ENTROPY_BACKWARDS = ("fused", "autodiff")  # config.cross_entropy_backward's values.


def autodiff_cross_entropy(logits: jax.Array, targets: jax.Array, label_smoothing: float,
                           classes: int) -> tuple[jax.Array, jax.Array]:
  """`smoothed_cross_entropy` with autodiff's backward pass (BENCHMARKS.md compares them)."""
  return _smoothed_cross_entropy_fwd(logits, targets, label_smoothing, classes)[0]


def train_step_flops(config: TransformerConfig, rows: int, source_len: int,
                     target_len: int) -> float:
  """Analytic FLOPs of one training step on [rows, source_len] / [rows, target_len].

  2 FLOPs per multiply-add of every matmul in the forward pass (projections,
  FFN, Q K^T and A V over the full padded lengths, the tied output projection),
  times 3 for forward + backward. XLA's own counts differ between backends (on a
  GPU it leaves kernels out), so MFU is quoted from this count.
  """
  d, d_ff, n = config.d_model, config.d_ff, config.num_heads
  d_k, d_v = config.head_dim_k, config.head_dim_v
  qkvo = d * n * (2 * d_k + 2 * d_v)  # Multiply-adds per token of W^Q, W^K, W^V, W^O.
  src, tgt = rows * source_len, rows * target_len
  encoder = src * (qkvo + 2 * d * d_ff + source_len * n * (d_k + d_v))
  decoder = (tgt * (qkvo + 2 * d * d_ff + target_len * n * (d_k + d_v))  # Self-attention.
             + tgt * d * n * (d_k + d_v) + src * d * n * (d_k + d_v)  # Cross: Q, O / K, V.
             + tgt * source_len * n * (d_k + d_v))
  logits = tgt * d * config.vocab_size
  multiply_adds = (config.encoder_layers * encoder + config.decoder_layers * decoder + logits)
  return 3 * 2 * float(multiply_adds)


def model_inputs(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  return {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}


def vocab_split_note(model_config: TransformerConfig) -> str:
  """What a refusal to split the vocabulary adds: an unpadded one may be an import from
  before import_model.py padded vocabularies to a multiple of vocab_padding.MULTIPLE
  rows, which split over any tensor axis of up to that many devices (a power of two)."""
  if model_config.vocab_padding or model_config.source_vocab_padding:
    return ""
  return (f"; a workdir imported before import_model.py padded vocabularies (to a multiple "
          f"of {vocab_padding.MULTIPLE} rows) splits once imported again: python "
          "import_model.py --from=SOURCE --workdir=NEW_WORKDIR")


class Trainer:
  """Sharded, jitted train and eval steps for one model config, config and mesh."""

  def __init__(self, model_config: TransformerConfig, config, mesh: jax.sharding.Mesh):
    self.model_config = model_config
    self.config = config
    self.mesh = mesh
    self.rules = tuple(tuple(r) for r in config.logical_axis_rules)
    self.train_model = Transformer(model_config.replace(deterministic=False, decode=False))
    self.eval_model = Transformer(model_config.replace(deterministic=True, decode=False))
    self.schedule = learning_rate_schedule(model_config.d_model, config.warmup_steps,
                                           config.learning_rate)
    self.optimizer = make_optimizer(config, self.schedule)
    platform = mesh.devices.flat[0].platform
    # How a non-finite step is skipped (see _train_step_fn); tests set both ways.
    self.skip_with_branch = platform == "cpu"
    if config.cross_entropy_backward not in CROSS_ENTROPY_BACKWARDS:
      raise ValueError(f"config.cross_entropy_backward must be one of {CROSS_ENTROPY_BACKWARDS}, "
                       f"got {config.cross_entropy_backward!r}")
    self.fused_backward = config.cross_entropy_backward == "fused"
    # The loss's classes: a padded vocabulary's rows (never produced) are none.
    self.classes = model_config.vocab_size - model_config.vocab_padding

    boxed = jax.eval_shape(self._boxed_init, self.key(0))
    self.state_shardings = sharding_lib.logical_shardings(boxed, mesh, self.rules)
    sharding_lib.check_even_splits(boxed.params, self.state_shardings.params,
                                   {"vocab": vocab_split_note(model_config)})
    self.abstract_state = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        nn.unbox(boxed), self.state_shardings)
    self.batch_sharding = sharding_lib.batch_sharding(mesh)
    replicated = sharding_lib.replicated(mesh)
    self._init = jax.jit(lambda rng: nn.unbox(self._boxed_init(rng)),
                         out_shardings=self.state_shardings)
    self._from_params = jax.jit(self._state_of, in_shardings=(self.state_shardings.params,),
                                out_shardings=self.state_shardings)
    self._train_step = compilation.PerShape(
        jax.jit(self._train_step_fn, in_shardings=(self.state_shardings, self.batch_sharding),
                out_shardings=(self.state_shardings, replicated), donate_argnums=(0,)),
        "Train step", key=lambda state, batch: batch,
        describe=lambda state, batch: f"batch {list(batch['inputs'].shape)}",
        context=self._context)
    self._eval_step = compilation.PerShape(
        jax.jit(self._eval_step_fn, in_shardings=(self.state_shardings.params,
                                                  self.batch_sharding),
                out_shardings=replicated),
        "Eval step", key=lambda params, batch: batch,
        describe=lambda params, batch: f"batch {list(batch['inputs'].shape)}",
        context=self._context)

  def key(self, seed) -> jax.Array:
    """A typed PRNG key of config.prng_impl (jax's name: threefry2x32, rbg, unsafe_rbg)."""
    return jax.random.key(seed, impl=self.config.prng_impl)

  def _context(self):
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.mesh))
    stack.enter_context(nn.logical_axis_rules(self.rules))
    return stack

  def _boxed_init(self, rng) -> TrainState:
    dummy = jnp.ones((1, 8), jnp.int32)
    return self._state_of(self.eval_model.init(rng, dummy, dummy)["params"])

  def _state_of(self, params) -> TrainState:
    return TrainState(step=jnp.array(0, jnp.int32), params=params,
                      opt_state=self.optimizer.init(params))

  def state_from_params(self, params) -> TrainState:
    """A state at step 0 holding `params` (fine-tuning: training.init_from), with a new
    optimizer state: Adam's moments zero, the schedule's warmup from its start."""
    with jax.set_mesh(self.mesh):
      start, _ = compilation.compile_logged(self._from_params, params,
                                            name="Optimizer state initialisation")
      return start(params)

  def init_state(self, seed: int) -> TrainState:
    rng = self.key(seed)
    # Threefry's GPU kernel for this program alone: on an H100 XLA's own lowering of the
    # base model's ~200 threefry calls compiled for 25-33 s (issue 58), and the train
    # step's dropout keeps it (faster steps).
    with jax.set_mesh(self.mesh), compilation.threefry_kernel():
      init, _ = compilation.compile_logged(self._init, rng, name="Parameter initialisation")
      return init(rng)

  # --- Steps ---------------------------------------------------------------------

  def _loss_sums(self, params, batch, rng):
    logits = self.train_model.apply({"params": params}, **model_inputs(batch),
                                    rngs={"dropout": rng})
    sums = cross_entropy_sums(logits, batch["targets"], self.config.label_smoothing,
                              with_accuracy=False, fused_backward=self.fused_backward,
                              classes=self.classes)
    return sums["loss"], sums

  def _train_step_fn(self, state: TrainState, batch):
    config = self.config
    # One key per step, independent of the mesh: the same run on any device layout.
    rng = jax.random.fold_in(self.key(config.seed), state.step)
    grad_fn = jax.grad(self._loss_sums, has_aux=True)
    accum = config.grad_accum_steps
    if accum == 1:
      grads, sums = grad_fn(state.params, batch, rng)
    else:
      micro = jax.tree_util.tree_map(
          lambda x: x.reshape((accum, x.shape[0] // accum) + x.shape[1:]), batch)

      def accumulate(carry, inputs):
        index, microbatch = inputs
        grads, sums = grad_fn(state.params, microbatch, jax.random.fold_in(rng, index))
        return jax.tree_util.tree_map(jnp.add, carry, (grads, sums)), None

      zeros = jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(
          grad_fn, state.params, jax.tree_util.tree_map(lambda x: x[0], micro), rng))
      (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum), micro))

    # Normalise by the batch's non-pad target tokens (all micro-batches together).
    tokens = jnp.maximum(sums["tokens"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / tokens, grads)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)

    def update(params, opt_state, grads):
      updates, opt_state = self.optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    # A non-finite step changes nothing; the loop stops or skips on `nonfinite`.
    # On CPUs a branch: a select between old and new state kept the old Adam
    # moments alive past their update, so XLA copied every one of them each step
    # (BENCHMARKS.md). On GPUs and TPUs a select: it fuses into the update's
    # elementwise kernels, while a branch's predicate is copied to the host, a
    # stall in the middle of every step.
    if self.skip_with_branch:
      params, opt_state = jax.lax.cond(finite, update, lambda p, o, g: (p, o),
                                       state.params, state.opt_state, grads)
    else:
      params, opt_state = jax.tree_util.tree_map(
          lambda new, old: jnp.where(finite, new, old),
          update(state.params, state.opt_state, grads), (state.params, state.opt_state))
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = {"loss": sums["loss"] / tokens, "nll": sums["nll"] / tokens,
               "tokens": sums["tokens"],
               "learning_rate": self.schedule(state.step), "grad_norm": grad_norm,
               "nonfinite": ~finite}
    return new_state, metrics

  def _eval_step_fn(self, params, batch):
    logits = self.eval_model.apply({"params": params}, **model_inputs(batch))
    return cross_entropy_sums(logits, batch["targets"], self.config.label_smoothing,
                              classes=self.classes)

  def compile_eval_ahead(self, batch) -> None:
    """Starts compiling the eval step for `batch`'s shape (a placed batch, or
    ShapeDtypeStructs with `batch_sharding`) in the background."""
    self._eval_step.compile_ahead(self.abstract_state.params, batch)

  def compile_train_step_ahead(self, batch) -> None:
    """Starts compiling the train step for `batch`'s shapes (ShapeDtypeStructs with
    `batch_sharding`, `TrainBatching.abstract_batch`) in the background: it overlaps the
    input pipeline's start, parameter initialisation or restoring, and the first batch."""
    self._train_step.compile_ahead(self.abstract_state, batch)

  def compile_train_step(self, state: TrainState, batch) -> float:
    """Compiles the train step for this batch shape (logged), or waits for the compile
    started ahead; returns XLA's FLOP count.

    With several processes it returns once every process has compiled (or loaded) its
    own: the first step's collective must not wait for a slower peer
    (`distributed.enter_together`)."""
    compiled = self._train_step.executable(state, batch)
    distributed.enter_together("flax_transformer_first_step")
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
      analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", 0.0))

  def train_step(self, state: TrainState, batch) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update; `state` is donated (do not reuse it)."""
    return self._train_step(state, batch)

  def eval_step(self, params, batch) -> dict[str, jax.Array]:
    with self._context():
      return self._eval_step(params, batch)


def evaluate(trainer: Trainer, params, batches) -> dict[str, float]:
  """Loss, perplexity and token accuracy over eval batches (already placed)."""
  totals = None
  for batch in batches:
    sums = trainer.eval_step(params, batch)
    totals = sums if totals is None else jax.tree_util.tree_map(jnp.add, totals, sums)
  if totals is None:
    raise ValueError("evaluation set is empty")
  totals = {k: float(v) for k, v in jax.device_get(totals).items()}
  tokens = max(totals["tokens"], 1.0)
  return {"eval_loss": totals["loss"] / tokens,
          "eval_perplexity": float(np.exp(totals["nll"] / tokens)),
          "eval_accuracy": totals["correct"] / tokens}
