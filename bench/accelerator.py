"""One accelerator, every figure of the accelerator issue (58), in one run.

python bench/accelerator.py --peer_path=FLAX/examples/wmt [--data=DIR] [--out=PATH]
python bench/accelerator.py --tiny     # CPU: every code path on tiny shapes (the suite runs it)

Sections, in order (the JSON, results/device_runs/accelerator_<device>.json or --out, is
rewritten after each, so a run cut short keeps what it measured):
1. readme_job: `train.py --config=configs/multi30k.py` from a cold compilation cache, then
   `decode.py --average_last=5` over test 2016 (sacreBLEU): wall times, compiles, ms/step.
2. warm_compile: the job relaunched on the filled cache, two steps profiled.
3. decode_trained: that model over test 2016 (--tiny: a short subset) by `Translator`,
   its first call (compiles) and warm.
4. base_bf16: our train step, as train.py runs it, against the peer's (Flax examples/wmt
   `models.py`, from --peer_path) at the paper's base shape, timed alternately; MFU from
   `training.train_step_flops`.
5. decode_base: beam search (beam 4, alpha 0.6, random base model, the paper's length
   bound), ours against the peer's `decode.beam_search`, batches 8, 32 and 128.
The sections of closed questions retired after commit 20bde6b; their records stay in
results/device_runs/.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MULTI30K, ROOT, alternating, model_config, print_table, random_ids, \
    train_command

# jax in this process must leave the device's memory to the train.py / decode.py
# subprocesses of sections 1-2; its own arrays grow the pool on demand.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

PEAKS_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # Dense bf16 FLOP/s (datasheets).
COMPILE_LINE = re.compile(r"(Parameter initialisation|Train step|Eval step|Beam search|Sampling) "
                          r"(?:for (.*?) )?"
                          r"(compiled|loaded from the compilation cache) in ([\d.]+) s")

# The JSON's headline keys: present in every record, null where unmeasured.
HEADLINE = ["device", "jax_version", "date", "readme_job_wall_s", "readme_job_decode_wall_s",
            "readme_job_test_bleu", "readme_job_ms_per_step", "init_compile_s_cold",
            "train_step_compile_s_cold", "train_step_compile_s_warm", "profile_trace_files",
            "base_bf16_mfu", "base_bf16_speedup_vs_peer", "decode_base_speedup_vs_peer_batch8",
            "decode_base_speedup_vs_peer_batch32", "decode_base_speedup_vs_peer_batch128",
            "decode_base_tokens_per_s_batch32", "decode_test2016_first_call_s",
            "decode_test2016_sentences_per_s"]


# The paper's base model; ~25k tokens a side (paper: ~25k source + ~25k target tokens per batch).
BASE = dict(vocab=32000, d_model=512, layers=6, heads=8, d_ff=2048, rows=192, length=128,
            dtype="bfloat16")
TINY_BASE = dict(BASE, vocab=500, d_model=32, layers=1, heads=2, d_ff=64, rows=4, length=16)
# --tiny decodes the first TINY_TEST_SENTENCES test 2016 sentences of at most
# TINY_TEST_TOKENS tokens: one batch shape, so one search compile a decode (each of
# the four shapes all 1000 take compiles in 3-15 s on a CPU).
TINY_TEST_SENTENCES, TINY_TEST_TOKENS = 100, 16


class Bench:
  def __init__(self, args):
    self.args = args
    self.tiny = args.tiny
    self.root = Path(args.scratch or tempfile.mkdtemp(prefix="accelerator_"))
    self.root.mkdir(parents=True, exist_ok=True)
    self.data = Path(args.data)
    self.shape = TINY_BASE if self.tiny else BASE
    self.record = {**dict.fromkeys(HEADLINE), "date": datetime.date.today().isoformat(),
                   "tiny": self.tiny,
                   "command": " ".join([sys.executable, *sys.argv]), "errors": {}}
    self.out = Path(args.out) if args.out else None
    self.start = time.time()

  def left_s(self) -> float:
    return self.args.budget_s - (time.time() - self.start)

  def save(self) -> None:
    if self.out is None:
      device = self.record.get("device", "unknown")
      name = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
      tiny = "_tiny" if self.tiny else ""
      self.out = ROOT / "results" / "device_runs" / f"accelerator_{name}{tiny}.json"
    self.out.parent.mkdir(parents=True, exist_ok=True)
    self.out.write_text(json.dumps(self.record, indent=1, default=float))

  def run_section(self, name, fn, min_left_s: float = 0.0) -> None:
    if self.args.sections and name not in self.args.sections:
      return
    if self.left_s() < min_left_s:
      self.record["errors"][name] = f"skipped: {self.left_s():.0f} s of the budget left"
      print(f"== {name}: skipped (budget)", flush=True)
      return
    print(f"== {name} ({self.left_s():.0f} s of the budget left)", flush=True)
    started = time.time()
    try:
      fn()
    except Exception as e:  # Keep the other sections' figures.
      import traceback

      traceback.print_exc()
      self.record["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
    self.record.setdefault("section_wall_s", {})[name] = time.time() - started
    self.save()

  def subprocess(self, argv, log: Path) -> float:
    """Runs argv from the repository root, output to `log`; returns wall seconds."""
    started = time.time()
    with open(log, "w") as f:
      proc = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            timeout=max(60.0, self.left_s()))
    wall = time.time() - started
    if proc.returncode:
      tail = log.read_text()[-3000:]
      raise RuntimeError(f"{argv[1]} exited {proc.returncode}:\n{tail}")
    return wall

  def test_2016(self, vocabulary: Path) -> tuple[list[str], list[str]]:
    """Test 2016's English sources and German references: all, or with --tiny the first
    TINY_TEST_SENTENCES whose source is at most TINY_TEST_TOKENS tokens of `vocabulary`."""
    from flax_transformer.data.sources import read_lines

    sources = read_lines(self.data / "test_2016_flickr.en.gz")
    references = read_lines(self.data / "test_2016_flickr.de.gz")
    if not self.tiny:
      return sources, references
    from flax_transformer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(vocabulary)
    short = [i for i, s in enumerate(sources)
             if len(tokenizer.tokenize(s)) <= TINY_TEST_TOKENS][:TINY_TEST_SENTENCES]
    return [sources[i] for i in short], [references[i] for i in short]

  def train_argv(self, workdir: Path, cache: Path, **overrides) -> list[str]:
    # --tiny: eval_max_shapes 2, the cap's code path, one compile fewer than the default.
    tiny = dict(num_train_steps=30, eval_every_steps=10, bleu_every_steps=20,
                checkpoint_every_steps=5, log_every_steps=5, eval_max_shapes=2)
    return train_command("tiny.py" if self.tiny else "multi30k.py", workdir, {
        "manual_dir": self.data, "compilation_cache_dir": cache,
        **(tiny if self.tiny else {}), **overrides})

  def readme_job(self) -> None:
    workdir, cache = self.root / "readme", self.root / "cache"
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    train_log = self.root / "readme_train.log"
    train_wall = self.subprocess(self.train_argv(workdir, cache), train_log)
    compiles = parse_compiles(train_log.read_text())
    from flax_transformer.training.metrics import read_metrics

    metrics = read_metrics(workdir)
    step_times = [m["step_time_s"] for m in metrics if "step_time_s" in m]
    hyp, ref = self.root / "readme_test.hyp", self.root / "test.ref"
    sources = self.root / "test.src"
    self.sentences, references = self.test_2016(workdir / "vocab.model")
    sources.write_text("\n".join(self.sentences) + "\n")
    ref.write_text("\n".join(references) + "\n")
    decode_log = self.root / "readme_decode.log"
    decode_wall = self.subprocess(
        [sys.executable, "decode.py", f"--workdir={workdir}", f"--input={sources}",
         f"--output={hyp}", "--average_last=5", f"--compilation_cache_dir={cache}"], decode_log)
    import sacrebleu

    hypotheses = hyp.read_text().splitlines()
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    train_compile = [c for c in compiles if c["what"] == "Train step"]
    self.record.update(
        readme_job_wall_s=train_wall + decode_wall, readme_job_train_wall_s=train_wall,
        readme_job_decode_wall_s=decode_wall, readme_job_test_bleu=bleu.score,
        readme_job_test_bleu_lowercased=sacrebleu.corpus_bleu(
            hypotheses, [references], lowercase=True).score,
        readme_job_steps=metrics[-1].get("step") if metrics else None,
        readme_job_ms_per_step=1000 * statistics.median(step_times),
        readme_job_log_step_times_ms=[1000 * t for t in step_times],
        readme_job_final=metrics[-1] if metrics else None,
        train_step_compile_s_cold=train_compile[0]["seconds"] if train_compile else None,
        init_compile_s_cold=next((c["seconds"] for c in compiles
                                  if c["what"] == "Parameter initialisation"), None),
        readme_job_compiles=compiles,
        readme_job_decode_compiles=parse_compiles(decode_log.read_text()),
        readme_job_eval_shapes=sorted({c["shape"] for c in compiles if c["what"] == "Eval step"}),
        readme_job_bleu_shapes=sorted({c["shape"] for c in compiles
                                       if c["what"] == "Beam search"}),
        attention=sorted(set(re.findall(r"Attention: (.*)", train_log.read_text()))))
    self.readme_workdir, self.cache, self.hyp = workdir, cache, hyp

  def warm_compile(self) -> None:
    """The job relaunched on the filled cache for a few steps, two of them profiled."""
    workdir = self.root / "readme_warm"
    shutil.rmtree(workdir, ignore_errors=True)
    log = self.root / "warm_train.log"
    wall = self.subprocess(self.train_argv(
        workdir, self.cache, num_train_steps=8, profile_first_step=4, profile_steps=2), log)
    compiles = parse_compiles(log.read_text())
    train = [c for c in compiles if c["what"] == "Train step"]
    traces = sorted(p for p in (workdir / "profile").rglob("*") if p.is_file())
    self.record.update(train_step_compile_s_warm=train[0]["seconds"] if train else None,
                       warm_compile_cache_hit=bool(train and train[0]["cached"]),
                       warm_launch_wall_s=wall, warm_launch_compiles=compiles,
                       profile_trace_files={str(p.relative_to(workdir)): p.stat().st_size
                                            for p in traces})

  def decode_trained(self) -> None:
    import jax

    from flax_transformer import compilation
    from flax_transformer.translation.search_config import SearchConfig
    from flax_transformer.translation.translator import Translator

    compilation.enable_cache(str(self.cache))
    sentences = self.sentences
    translator = Translator.from_workdir(self.readme_workdir,
                                         search=SearchConfig(beam_size=4, alpha=0.6),
                                         average_last=5, devices=jax.local_devices()[:1])
    started = time.perf_counter()
    first = translator.translate(sentences)
    first_s = time.perf_counter() - started
    runs = []
    for _ in range(1 if self.tiny else 3):
      started = time.perf_counter()
      again = translator.translate(sentences)
      runs.append(time.perf_counter() - started)
    seconds = statistics.median(runs)
    decode_py = self.hyp.read_text().splitlines()
    self.record.update(
        decode_test2016_sentences=len(sentences),
        decode_test2016_sentences_per_s=len(sentences) / seconds,
        decode_test2016_runs_s=runs, decode_test2016_first_call_s=first_s,
        decode_test2016_compile_s=translator._search_fn.compile_seconds,
        decode_test2016_same_output_as_decode_py=first == again == decode_py)

  def peer(self, key: str):
    """The peer's `models` and `decode` modules; (None, None), recorded as the error of
    `key`, without --peer_path."""
    if not self.args.peer_path:
      self.record["errors"][key] = "no --peer_path: peer rows not measured"
      return None, None
    modules = []
    for name in ("models", "decode"):
      spec = importlib.util.spec_from_file_location(f"peer_{name}",
                                                    Path(self.args.peer_path) / f"{name}.py")
      modules.append(importlib.util.module_from_spec(spec))
      spec.loader.exec_module(modules[-1])
    return tuple(modules)

  def base_bf16(self) -> None:
    import jax
    import jax.numpy as jnp
    import optax

    from configs import default
    from flax_transformer.training import sharding
    from flax_transformer.training import steps as training

    shape = self.shape
    rows, length, vocab = shape["rows"], shape["length"], shape["vocab"]
    host_batch = random_ids(vocab, rows, length)
    steps = 3 if self.tiny else 20

    # Ours: the library's Trainer, as train.py builds it (config and jax defaults).
    our_config = model_config(shape, dtype=shape["dtype"])
    trainer = training.Trainer(our_config, default.get_config(),
                               sharding.make_mesh({"data": 1}, jax.devices()[:1]))
    started = time.perf_counter()
    holder = [trainer.init_state(0)]
    init_compile = time.perf_counter() - started
    batch = jax.device_put(host_batch, trainer.batch_sharding)
    started = time.perf_counter()
    trainer.compile_train_step(holder[0], batch)
    ours_compile = time.perf_counter() - started

    def ours():
      for _ in range(steps):
        holder[0], metrics = trainer.train_step(holder[0], batch)
      jax.block_until_ready((holder[0], metrics))

    timed = {"ours": ours}
    peer_compile = None
    models, _ = self.peer("base_bf16_peer")
    if models is not None:
      # The peer's model at the same shapes; its train.py loss (label smoothing 0.1,
      # normalised by non-pad tokens) and Adam, without its pmap.
      peer_model = models.Transformer(peer_config(
          models, shape, max_len=length, dropout_rate=0.1, attention_dropout_rate=0.0,
          deterministic=False))
      params = jax.jit(peer_model.init)(jax.random.PRNGKey(0), host_batch["inputs"][:1],
                                        host_batch["targets"][:1])["params"]
      tx = optax.adam(1e-4, b1=0.9, b2=0.98, eps=1e-9)
      opt_state = tx.init(params)

      def peer_step(params, opt_state, step, batch):
        def loss_fn(params):
          logits = peer_model.apply({"params": params}, batch["inputs"], batch["targets"],
                                    rngs={"dropout": jax.random.fold_in(
                                        jax.random.PRNGKey(0), step)})
          confidence, smoothing = 0.9, 0.1
          low = smoothing / (vocab - 1)
          soft = jax.nn.one_hot(batch["targets"], vocab) * (confidence - low) + low
          loss = -jnp.sum(soft * jax.nn.log_softmax(logits), axis=-1)
          weights = (batch["targets"] > 0).astype(jnp.float32)
          return jnp.sum(loss * weights) / jnp.sum(weights)
        grads = jax.grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, step + 1

      device_batch = jax.device_put(host_batch, jax.devices()[0])
      started = time.perf_counter()
      compiled = jax.jit(peer_step, donate_argnums=(0, 1)).lower(
          params, opt_state, jnp.int32(0), device_batch).compile()
      peer_compile = time.perf_counter() - started
      peer_holder = [(params, opt_state, jnp.int32(0))]

      def peer():
        for _ in range(steps):
          peer_holder[0] = compiled(*peer_holder[0], device_batch)
        jax.block_until_ready(peer_holder[0])

      timed["peer"] = peer
    for fn in timed.values():
      fn()  # Warm-up.
    runs = {key: [s / steps for s in seconds]
            for key, seconds in alternating(timed, 3 if self.tiny else 5).items()}
    flops = training.train_step_flops(our_config, rows, length, length)
    ours_s = statistics.median(runs["ours"])
    device_kind = jax.devices()[0].device_kind
    peak = next((v for k, v in PEAKS_BF16.items() if k in device_kind), None)
    out = {"shape": shape, "ours_ms": 1000 * ours_s,
           "ours_runs_ms": [1000 * x for x in runs["ours"]],
           "ours_compile_s": ours_compile, "init_compile_s": init_compile,
           "analytic_flops_per_step": flops,
           "ours_tflops_per_s": flops / ours_s / 1e12,
           "tokens_per_s_a_side": rows * length / ours_s, "peak_bf16_flops": peak}
    if peak:
      out["ours_mfu_of_bf16_peak"] = flops / ours_s / peak
    if "peer" in runs:
      peer_s = statistics.median(runs["peer"])
      out.update(peer_ms=1000 * peer_s, peer_runs_ms=[1000 * x for x in runs["peer"]],
                 peer_compile_s=peer_compile, speedup_vs_peer=peer_s / ours_s)
    self.record.update(base_bf16=out, base_bf16_mfu=out.get("ours_mfu_of_bf16_peak"),
                       base_bf16_speedup_vs_peer=out.get("speedup_vs_peer"))

  def decode_base(self) -> None:
    """Per batch size (--tiny: 8 and 32; a third is one more compile, no new code path),
    sources of 32 tokens. A random model rarely emits EOS, so both search to the length
    bound (source length + 50): tokens/s counts the best hypotheses' tokens up to EOS."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flax_transformer import Transformer
    from flax_transformer.data.tokenizer import trim
    from flax_transformer.translation.search_config import SearchConfig
    from flax_transformer.translation.programs import make_search_fn

    shape, source_len, beam, extra = self.shape, 32, 4, 50
    max_len = source_len + extra
    config = model_config(shape, max_len=max_len, deterministic=True, dtype=shape["dtype"])
    sample = np.ones((1, source_len), np.int32)
    params = Transformer(config).init(jax.random.PRNGKey(0), sample, sample)["params"]
    search = jax.jit(make_search_fn(config, SearchConfig(beam_size=beam, alpha=0.6,
                                                         max_extra=extra)))
    models, peer_decode = self.peer("decode_base_peer")
    if models is not None:
      search_config = peer_config(models, shape, max_len=max_len, deterministic=True)
      decode_config = search_config.replace(decode=True)
      peer_params = models.Transformer(search_config).init(
          jax.random.PRNGKey(0), sample, sample)["params"]

      def peer_search(params, inputs):
        # The peer's train.py initialize_cache + predict_step, beam 4, alpha 0.6.
        cache = models.Transformer(decode_config).init(
            jax.random.PRNGKey(0), jnp.ones(inputs.shape, jnp.float32),
            jnp.ones((inputs.shape[0], max_len), jnp.float32))["cache"]
        encoded = peer_decode.flat_batch_beam_expand(models.Transformer(search_config).apply(
            {"params": params}, inputs, method=models.Transformer.encode), beam)
        raw_inputs = peer_decode.flat_batch_beam_expand(inputs, beam)

        def tokens_ids_to_logits(flat_ids, flat_cache):
          logits, new_vars = models.Transformer(decode_config).apply(
              {"params": params, "cache": flat_cache}, encoded, raw_inputs, flat_ids,
              mutable=["cache"], method=models.Transformer.decode)
          return logits.squeeze(axis=1), new_vars["cache"]

        seqs, _ = peer_decode.beam_search(inputs, cache, tokens_ids_to_logits, beam_size=beam,
                                          alpha=0.6, eos_id=1, max_decode_len=max_len)
        return seqs[:, -1, 1:]

    rng = jax.random.PRNGKey(0)
    results = {}
    for batch in (8, 32) if self.tiny else (8, 32, 128):
      inputs = np.random.default_rng(batch).integers(2, shape["vocab"], (batch, source_len)
                                                     ).astype(np.int32)
      started = time.perf_counter()
      ours_compiled = search.lower(params, inputs, rng).compile()
      out = {"ours_compile_s": time.perf_counter() - started}
      timed = {"ours": lambda: ours_compiled(params, inputs, rng).sequences[:, 0]}
      if models is not None:
        started = time.perf_counter()
        peer_compiled = jax.jit(peer_search).lower(peer_params, inputs).compile()
        out["peer_compile_s"] = time.perf_counter() - started
        timed["peer"] = lambda: peer_compiled(peer_params, inputs)
      tokens = {k: sum(len(trim(row)) for row in np.asarray(jax.block_until_ready(fn())))
                for k, fn in timed.items()}  # Also the warm-up.
      runs = alternating({k: lambda fn=fn: jax.block_until_ready(fn()) for k, fn in timed.items()},
                         3 if self.tiny else (10 if batch <= 32 else 5))
      for k in timed:
        seconds = statistics.median(runs[k])
        out.update({f"{k}_s_per_batch": seconds, f"{k}_sentences_per_s": batch / seconds,
                    f"{k}_tokens_per_s": tokens[k] / seconds, f"{k}_tokens": tokens[k],
                    f"{k}_runs_s": runs[k]})
      if "peer" in timed:
        out["speedup_vs_peer"] = statistics.median(runs["peer"]) / statistics.median(runs["ours"])
      results[str(batch)] = out
    self.record["decode_base"] = {"shape": shape, "source_len": source_len, "beam_size": beam,
                                  "alpha": 0.6, "max_decode_len": max_len, "batches": results}
    for batch, out in results.items():
      self.record[f"decode_base_speedup_vs_peer_batch{batch}"] = out.get("speedup_vs_peer")
      self.record[f"decode_base_tokens_per_s_batch{batch}"] = out["ours_tokens_per_s"]

  def describe_device(self) -> None:
    import flax
    import jax
    import optax

    device = jax.devices()[0]
    self.record.update(device=device.device_kind, platform=device.platform,
                       jax_version=jax.__version__, device_count=jax.device_count(),
                       host_cores=os.cpu_count(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                       threefry_gpu_kernel_lowering=jax.config.jax_threefry_gpu_kernel_lowering,
                       jax_environment={k: v for k, v in os.environ.items()
                                        if k.startswith("JAX_")},
                       flax_version=flax.__version__, optax_version=optax.__version__)
    self.save()

  def run(self) -> None:
    self.describe_device()  # Devices and versions only before the subprocesses: no arrays.
    self.run_section("readme_job", self.readme_job)
    if hasattr(self, "readme_workdir"):
      self.run_section("warm_compile", self.warm_compile)
      self.run_section("decode_trained", self.decode_trained, min_left_s=20)
    else:
      self.record["errors"]["readme_sections"] = "not run: the README job did not run"
    self.run_section("base_bf16", self.base_bf16, min_left_s=40)
    self.run_section("decode_base", self.decode_base, min_left_s=40)
    from flax_transformer.network import attention

    self.record["attention_in_process"] = sorted(attention._reported)
    self.record["bench_wall_s"] = time.time() - self.start
    self.save()
    print_table([{"key": k, "value": self.record.get(k)} for k in HEADLINE], ["key", "value"])
    for name, error in self.record["errors"].items():
      print(f"! {name}: {error.splitlines()[0] if error else ''}")
    print(f"wrote {self.out}")


SECTIONS = ("readme_job", "warm_compile", "decode_trained", "base_bf16", "decode_base")  # In order.


def peer_config(models, shape: dict, **fields):
  """The peer's TransformerConfig at `shape` (BASE's keys), with our tied embeddings and
  projection; `fields` its others."""
  import jax.numpy as jnp

  return models.TransformerConfig(
      vocab_size=shape["vocab"], output_vocab_size=shape["vocab"], share_embeddings=True,
      logits_via_embedding=True, emb_dim=shape["d_model"], num_heads=shape["heads"],
      num_layers=shape["layers"], qkv_dim=shape["d_model"], mlp_dim=shape["d_ff"],
      dtype=jnp.dtype(shape["dtype"]), **fields)


def parse_compiles(log: str) -> list[dict]:
  return [{"what": m.group(1), "shape": m.group(2) or "", "cached": m.group(3) != "compiled",
           "seconds": float(m.group(4))} for m in COMPILE_LINE.finditer(log)]


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--peer_path", help="Flax's examples/wmt directory (models.py, decode.py)")
  parser.add_argument("--data", default=str(MULTI30K), help="the Multi30k .gz files")
  parser.add_argument("--out",
                      help="JSON path (default results/device_runs/accelerator_<device>.json)")
  parser.add_argument("--scratch", help="workdirs, caches and logs (default: a temp dir)")
  parser.add_argument("--tiny", action="store_true",
                      help="tiny shapes and few steps: every code path, on a CPU, in minutes")
  parser.add_argument("--sections", type=lambda v: v.split(","), default=None,
                      help="comma-separated sections to run (default: all); readme_job is "
                      "needed by warm_compile and decode_trained")
  parser.add_argument("--budget_s", type=float, default=480.0,
                      help="later sections are skipped when less than they need is left")
  args = parser.parse_args()
  unknown = sorted(set(args.sections or ()) - set(SECTIONS))
  if unknown:
    parser.error(f"--sections: no section {', '.join(unknown)} (sections: {', '.join(SECTIONS)})")
  # In-process sections run with the XLA flags train.py and decode.py set (the peer,
  # in the same process, too); the record names them.
  from flax_transformer import compilation

  compilation.set_default_xla_flags()
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
  for name in ("jax", "absl", "orbax", "grain", "tensorflow_datasets"):
    logging.getLogger(name).setLevel(logging.WARNING)
  Bench(args).run()


if __name__ == "__main__":
  main()
