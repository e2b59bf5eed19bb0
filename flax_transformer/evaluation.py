"""Evaluation during training: the eval loss on fixed batch shapes, and beam-search
BLEU and chrF against the raw references."""

from __future__ import annotations

import dataclasses
import logging

import jax
import numpy as np
import sacrebleu

from flax_transformer.data import multilingual
from flax_transformer.data.sources import load_pairs
from flax_transformer.network.config import TransformerConfig
from flax_transformer.training import sharding as sharding_lib
from flax_transformer.training.cadence import WorkDue
from flax_transformer.training.steps import Trainer, evaluate
from flax_transformer.translation import batching
from flax_transformer.translation.directions import cut, token_ids
from flax_transformer.translation.search_config import SearchConfig
from flax_transformer.translation.programs import (batch_keys, make_search_fn, search_batches,
                                                   search_per_shape, translate_ids)


@dataclasses.dataclass
class EvalSet:
  """Tokenized evaluation pairs and their raw references (for BLEU)."""

  ids: list  # (source ids, target ids) per pair.
  references: list[str]
  pairs: object = None  # As loaded (a multilingual run's: data.multilingual's directions).


def eval_set(config, tokenizer, split: str, model_languages=None) -> EvalSet:
  loaded = load_pairs(config, split, config.eval_dataset_name or None, model_languages)
  pairs = [loaded[i] for i in range(len(loaded))]
  return EvalSet(ids=[(tokenizer.source.tokenize(s), tokenizer.target.tokenize(t))
                      for s, t in pairs],
                 references=[t for _, t in pairs], pairs=loaded)



class Evaluation:
  """Eval loss and beam-search BLEU of the current parameters, on fixed batch shapes."""

  def __init__(self, config, model_config: TransformerConfig, trainer: Trainer, tokenizer,
               shard_batch, dp_size: int, model_languages=None):
    self.config, self.trainer, self.tokenizer = config, trainer, tokenizer
    self.shard_batch = shard_batch  # A global batch every host holds -> sharded arrays.
    self.mesh, self.dp_size, self.max_len = trainer.mesh, dp_size, model_config.max_len
    # model_languages: a fine-tuning run's source model's (data.sources.load_pairs).
    self.sets = {"": eval_set(config, tokenizer, config.eval_split, model_languages)}
    if config.test_bleu_every_steps > 0:  # Only ever reported (time to quality).
      self.sets["test_"] = eval_set(config, tokenizer, config.test_split, model_languages)
    self.host_batches = []  # Formed once; placed on the devices at each evaluation.
    for batch in batching.eval_batches(self.sets[""].ids, batch_tokens=config.eval_batch_tokens,
                                       max_length=self.max_len, row_multiple=dp_size,
                                       max_widths=config.eval_max_shapes):
      if 0 <= config.num_eval_steps <= len(self.host_batches):
        break
      batch.pop("index")
      self.host_batches.append(batch)
    logging.info("Evaluation: %d batches in %d shape(s) (cap config.eval_max_shapes=%d)",
                 len(self.host_batches), len({b["inputs"].shape for b in self.host_batches}),
                 config.eval_max_shapes)
    # A multilingual run's BLEU: per direction, its target token forced (data.multilingual).
    self.directions = multilingual.eval_directions(self.sets[""], tokenizer)
    search = SearchConfig(beam_size=config.beam_size, alpha=config.alpha,
                          max_extra=config.max_extra)
    self.search_fn = search_per_shape(
        jax.jit(make_search_fn(model_config, search),
                out_shardings=sharding_lib.replicated(self.mesh)),
        search, max_shapes=config.eval_max_shapes * len(self.sets)  # Each set's widths,
        * max(1, len(self.directions)),  # each direction's rows.
        context=lambda: jax.set_mesh(self.mesh))

  def _bleu_sources(self, prefix: str) -> list:
    pairs, n = self.sets[prefix], self.config.num_bleu_sentences
    return [s for s, _ in pairs.ids[:len(pairs.ids) if n < 0 else n]]

  def compile_ahead(self) -> None:
    """Starts compiling every eval and BLEU shape this run will use, in the background."""
    config, trainer = self.config, self.trainer
    abstract = lambda shape: jax.ShapeDtypeStruct(  # noqa: E731
        shape, np.int32, sharding=trainer.batch_sharding)
    for shape in dict.fromkeys(b["inputs"].shape for b in self.host_batches):
      trainer.compile_eval_ahead({k: abstract(shape) for k in self.host_batches[0]})
    key = jax.eval_shape(lambda: batch_keys(0, 1)[0])  # As translate_ids makes them.
    for prefix, every in (("", config.bleu_every_steps), ("test_", config.test_bleu_every_steps)):
      if every > 0 and prefix in self.sets and not self.directions:  # Those compile on use.
        batches = search_batches(self._bleu_sources(prefix), **self._search_batching())
        for shape in dict.fromkeys(b["inputs"].shape for b in batches):
          self.search_fn.compile_ahead(trainer.abstract_state.params, abstract(shape), key)

  def _search_batching(self) -> dict:
    return dict(batch_tokens=self.config.eval_batch_tokens, max_length=self.max_len,
                row_multiple=self.dp_size, max_widths=self.config.eval_max_shapes)

  def __call__(self, params, due: WorkDue, stop=lambda: False) -> dict[str, float]:
    """The due evaluations' metrics. `stop()` (a SIGTERM: a preemption notice) is asked
    before each part and between BLEU batches; once true, the rest is dropped."""
    out = {}
    if due.eval and not stop():
      out.update(evaluate(self.trainer, params, (self.shard_batch(b) for b in self.host_batches)))
    if due.bleu and not stop():
      out.update(self.bleu(params, "", stop))
    if due.test_bleu and not stop():
      out.update(self.bleu(params, "test_", stop))
    return out

  def bleu(self, params, prefix: str, stop=lambda: False) -> dict[str, float]:
    if self.directions:
      return self._bleu_per_direction(params, prefix, stop)
    sources = self._bleu_sources(prefix)
    with jax.set_mesh(self.mesh):
      hyps = translate_ids(self.search_fn, params, sources,
                           place=lambda x: self.shard_batch({"inputs": x})["inputs"],
                           stop=stop, **self._search_batching())
    searched = sum(h is not None for h in hyps)
    if searched < len(sources):
      logging.warning("%sBLEU cut short by the stop: %d of %d sentences searched; not reported",
                      prefix, searched, len(sources))
      return {}
    hypotheses = [self.tokenizer.target.detokenize(h[0][0]) for h in hyps]
    references = self.sets[prefix].references[:len(sources)]
    return {prefix + "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            prefix + "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}

  def _bleu_per_direction(self, params, prefix: str, stop) -> dict[str, float]:
    """BLEU and chrF of each direction ('bleu_en-de'), its target token forced and cut,
    and their means ('bleu'); the first num_bleu_sentences of each direction's set."""
    out, n = {}, self.config.num_bleu_sentences
    sets = (self.directions if prefix == "" else
            multilingual.eval_directions(self.sets[prefix], self.tokenizer))
    tokens = token_ids(forced for _, forced, _ in sets.values())  # '<2de>', ...
    for name, (sources, forced, references) in sets.items():
      count = len(sources) if n < 0 else min(n, len(sources))
      with jax.set_mesh(self.mesh):
        hyps = translate_ids(self.search_fn, params, sources[:count],
                             place=lambda x: self.shard_batch({"inputs": x})["inputs"],
                             stop=stop, prefixes=[forced] * count, **self._search_batching())
      if any(h is None for h in hyps):
        logging.warning("%sBLEU cut short by the stop; not reported", prefix)
        return {}
      hypotheses = [self.tokenizer.target.detokenize(cut(h[0][0], len(forced), tokens))
                    for h in hyps]
      out[f"{prefix}bleu_{name}"] = sacrebleu.corpus_bleu(hypotheses,
                                                          [references[:count]]).score
      out[f"{prefix}chrf_{name}"] = sacrebleu.corpus_chrf(hypotheses,
                                                          [references[:count]]).score
    for metric in ("bleu", "chrf"):
      values = [v for k, v in out.items() if k.startswith(f"{prefix}{metric}_")]
      out[prefix + metric] = sum(values) / len(values)
    logging.info("%sBLEU per direction: %s (mean %.2f)", prefix, ", ".join(
        f"{name} {out[f'{prefix}bleu_{name}']:.2f}" for name in sets), out[prefix + "bleu"])
    return out
