"""The paper's training recipe as the train step applies it (section 5.3-5.4), each
against a reference computed here: label-smoothed loss (eps_ls = 0.1), the
inverse-square-root warmup, Adam(0.9, 0.98, 1e-9), and dropout reaching the model.

The trainer is built from `configs/default.py` unchanged except for its size, so a
change to a default or to how the step uses it fails here, not only a change to the
functions on their own (tests/test_training.py checks those).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from configs import default
from flax_transformer.network.config import TransformerConfig
from flax_transformer.training import sharding
from flax_transformer.training import steps as training
from test_training import synthetic_batches  # tests/ is on pytest's path

# The paper's values, written out rather than read from the code under test.
PAPER_ADAM = dict(b1=0.9, b2=0.98, eps=1e-9)
PAPER_LABEL_SMOOTHING = 0.1
WARMUP = 3  # Small, so five steps see the warmup ramp and the decay after it.
MODEL = TransformerConfig(vocab_size=64, d_model=32, d_ff=64, num_heads=4, num_layers=2,
                          max_len=16, dropout_rate=0.0)


def paper_config():
  config = default.get_config()
  config.unlock()
  config.warmup_steps = WARMUP
  return config


def trainer_for(model_config=MODEL, config=None):
  return training.Trainer(model_config, config or paper_config(),
                          sharding.make_mesh({"data": 1}, jax.devices()[:1]))


def batches(n, rows=6, seed=0):
  return list(synthetic_batches(n, rows=rows, length=10, vocab=MODEL.vocab_size, seed=seed))


def paper_rate(step, d_model=MODEL.d_model, warmup=WARMUP):
  """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), steps from 1 (eq. 3)."""
  return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def smoothed_loss_numpy(logits, targets, eps):
  """Per-token mean over non-pad targets of -sum_v q_v log p_v, with q = eps/V on every
  class plus 1 - eps on the true one (Szegedy et al.), in float64."""
  logits = np.asarray(logits, np.float64)
  log_p = logits - logits.max(-1, keepdims=True)
  log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
  vocab = logits.shape[-1]
  total, tokens = 0.0, 0
  for b, t in zip(*np.nonzero(targets)):
    q = np.full(vocab, eps / vocab)
    q[targets[b, t]] += 1.0 - eps
    total += -(q * log_p[b, t]).sum()
    tokens += 1
  return total / tokens


def reference_gradients(trainer, eps):
  """(params, batch) -> d(mean smoothed loss)/d(params) by autodiff of optax's smoothed
  cross-entropy; jitted, so batches of one shape compile it once."""
  import optax

  def loss(p, inputs, targets):
    weights = (targets != 0).astype(jnp.float32)
    logits = trainer.eval_model.apply({"params": p}, inputs, targets)
    labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), eps)
    return jnp.sum(weights * optax.softmax_cross_entropy(logits, labels)) / jnp.sum(weights)
  gradients = jax.jit(jax.grad(loss))
  return lambda params, batch: gradients(params, batch["inputs"], batch["targets"])


def eval_logits(trainer):
  """(params, batch) -> the deterministic model's logits, jitted (one compile a shape)."""
  apply = jax.jit(trainer.eval_model.apply)
  return lambda params, batch: apply({"params": params}, batch["inputs"], batch["targets"])


def test_train_step_is_the_papers_smoothed_loss_schedule_and_adam():
  """Five steps, each checked against: the loss from the parameters it started with,
  the paper's rate for its step number, and one Adam update in float64 numpy from
  reference gradients (moments carried across steps, bias-corrected)."""
  trainer = trainer_for()
  state = trainer.init_state(seed=0)
  leaves = lambda tree: [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(tree)]  # noqa: E731
  m = [np.zeros_like(p) for p in leaves(state.params)]
  v = [np.zeros_like(p) for p in leaves(state.params)]
  b1, b2, eps = PAPER_ADAM["b1"], PAPER_ADAM["b2"], PAPER_ADAM["eps"]
  logits_of = eval_logits(trainer)
  gradients_of = reference_gradients(trainer, PAPER_LABEL_SMOOTHING)
  for step, batch in enumerate(batches(5), start=1):
    before = jax.device_get(state.params)
    logits = logits_of(before, batch)
    expected_loss = smoothed_loss_numpy(logits, batch["targets"], PAPER_LABEL_SMOOTHING)
    grads = leaves(gradients_of(before, batch))
    state, metrics = trainer.train_step(state, jax.device_put(batch, trainer.batch_sharding))

    np.testing.assert_allclose(float(metrics["loss"]), expected_loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["learning_rate"]), paper_rate(step), rtol=1e-6)
    rate = paper_rate(step)
    for i, (p, g, new) in enumerate(zip(leaves(before), grads, leaves(state.params))):
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      m_hat, v_hat = m[i] / (1 - b1 ** step), v[i] / (1 - b2 ** step)
      expected = p - rate * m_hat / (np.sqrt(v_hat) + eps)
      # Adam moves every weight by about the rate (a normalised step); float32
      # gradients differ from the reference's by ~1e-6 relative, which moves a
      # weight by far less than 1% of the rate unless its gradient is ~0.
      np.testing.assert_allclose(new, expected, rtol=0, atol=0.01 * rate,
                                 err_msg=f"step {step}, parameter leaf {i}")


def test_adam_betas_and_epsilon_are_the_papers():
  """The optimiser the trainer builds, on gradients where each constant shows: beta1
  and beta2 across steps of changing gradients, epsilon on gradients near its size."""
  config = paper_config()
  optimizer = training.make_optimizer(config, lambda count: 1.0)
  params = {"w": jnp.zeros(4)}
  opt_state = optimizer.init(params)
  gradients = [np.array([1.0, -2.0, 3e-9, 1e-9]), np.array([-0.5, 4.0, -1e-9, 2e-9]),
               np.array([2.0, 1.0, 5e-10, -3e-9])]
  b1, b2, eps = PAPER_ADAM["b1"], PAPER_ADAM["b2"], PAPER_ADAM["eps"]
  m = v = np.zeros(4)
  expected = np.zeros(4)
  for t, g in enumerate(gradients, start=1):
    updates, opt_state = optimizer.update({"w": jnp.asarray(g, jnp.float32)}, opt_state, params)
    params = {"w": params["w"] + updates["w"]}
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    expected = expected - (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    np.testing.assert_allclose(np.asarray(params["w"]), expected, rtol=1e-4, err_msg=f"step {t}")


def test_defaults_are_the_papers_recipe():
  config = default.get_config()
  assert (config.adam_b1, config.adam_b2, config.adam_eps) == (0.9, 0.98, 1e-9)
  assert (config.label_smoothing, config.warmup_steps, config.learning_rate) == (0.1, 4000, 1.0)
  assert (config.grad_clip_norm, config.weight_decay) == (0.0, 0.0)  # The paper has neither.


def test_train_step_applies_the_configured_dropout():
  """With P_drop = 0.3 the step's loss is the loss of a dropped-out model: it differs
  from the deterministic loss and from one under another seed's masks; with 0 it is
  the deterministic loss."""
  batch = batches(1)[0]

  def first_loss(rate, seed=0):
    config = paper_config()
    config.seed = seed
    trainer = trainer_for(MODEL.replace(dropout_rate=rate), config)
    state = trainer.init_state(seed=0)  # The same parameters whatever the dropout seed.
    params = jax.device_get(state.params)
    logits = eval_logits(trainer)(params, batch)
    _, metrics = trainer.train_step(state, jax.device_put(batch, trainer.batch_sharding))
    return float(metrics["loss"]), smoothed_loss_numpy(logits, batch["targets"],
                                                       PAPER_LABEL_SMOOTHING)

  no_dropout, deterministic = first_loss(0.0)
  np.testing.assert_allclose(no_dropout, deterministic, rtol=1e-5)
  dropped, deterministic = first_loss(0.3)
  other_seed, _ = first_loss(0.3, seed=1)
  assert abs(dropped - deterministic) > 1e-3 * deterministic
  assert abs(dropped - other_seed) > 1e-5 * deterministic  # Near-uniform at init: small.


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_dropout_in_the_train_step_drops_that_fraction(rate):
  """The train model's dropout layers zero about P_drop of the activations they see."""
  trainer = trainer_for(MODEL.replace(dropout_rate=rate))
  params = jax.device_get(trainer.init_state(seed=0).params)
  batch = batches(1, rows=16)[0]
  _, captured = trainer.train_model.apply(
      {"params": params}, batch["inputs"], batch["targets"], capture_intermediates=True,
      mutable=["intermediates"], rngs={"dropout": jax.random.PRNGKey(3)})
  flat = jax.tree_util.tree_flatten_with_path(captured["intermediates"])[0]
  outputs = [np.asarray(x) for path, x in flat if "Dropout" in jax.tree_util.keystr(path)]
  assert len(outputs) == 2 + 2 * MODEL.num_layers + 3 * MODEL.num_layers  # Embeddings + sublayers.
  zeros = np.mean(np.concatenate([o.ravel() == 0 for o in outputs]))
  assert abs(zeros - rate) < 0.02, zeros


def test_both_cross_entropy_backwards_make_the_same_step():
  """config.cross_entropy_backward picks how the loss is differentiated, never what."""
  batch = jax.device_put(batches(1)[0])
  params = {}
  for backward in ("fused", "autodiff"):
    config = paper_config()
    config.cross_entropy_backward = backward
    trainer = trainer_for(config=config)
    assert trainer.fused_backward == (backward == "fused")
    state, metrics = trainer.train_step(trainer.init_state(seed=0), batch)
    params[backward] = jax.device_get(state.params)
  for fused, autodiff in zip(jax.tree_util.tree_leaves(params["fused"]),
                             jax.tree_util.tree_leaves(params["autodiff"])):
    # Adam moves each weight by about the rate whatever the gradient's size, so
    # float32 rounding between the two backwards shows as a tiny share of the rate.
    np.testing.assert_allclose(fused, autodiff, rtol=0, atol=1e-3 * paper_rate(1))


def test_prng_impl_draws_the_dropout_masks():
  """config.prng_impl is the generator behind dropout: from the same parameters (the
  impls would initialise different ones) and the same seed, rbg's masks give another
  loss than threefry's, and each is reproducible run to run."""
  batch = batches(1)[0]
  params = None

  def first_losses(impl, runs=1):
    nonlocal params
    config = paper_config()
    config.prng_impl = impl
    trainer = trainer_for(MODEL.replace(dropout_rate=0.3), config)
    if params is None:
      params = jax.device_get(trainer.init_state(seed=0).params)
    placed = jax.device_put(batch, trainer.batch_sharding)

    def start():  # Afresh for each step: the step donates its state.
      state = training.TrainState(step=jnp.array(0, jnp.int32), params=params,
                                  opt_state=trainer.optimizer.init(params))
      return jax.device_put(state, trainer.state_shardings)
    return [float(trainer.train_step(start(), placed)[1]["loss"]) for _ in range(runs)]

  (threefry,), (rbg, rbg_again) = first_losses("threefry2x32"), first_losses("rbg", runs=2)
  assert np.isfinite(rbg) and abs(rbg - threefry) > 1e-5 * threefry  # Near-uniform at init.
  assert rbg_again == rbg


def test_initialisation_compiled_with_threefrys_kernel_draws_xla_lowerings_bits():
  """init_state compiles under threefry's GPU kernel (compile time): the parameters must be
  bit for bit those of the plain program, as initialised before (on a GPU this compares
  the kernel with XLA's lowering; elsewhere, that the switch leaves the program alone)."""
  trainer = trainer_for()
  ours = trainer.init_state(7)
  with jax.set_mesh(trainer.mesh):
    plain = jax.jit(lambda rng: nn.unbox(trainer._boxed_init(rng)))(trainer.key(7))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours),
                          jax.tree_util.tree_leaves(plain)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
