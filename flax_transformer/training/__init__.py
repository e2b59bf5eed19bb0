"""Training: sharding, the jitted steps, metrics, several processes as one run; the
loop's parts (config checks, cadence, progress, stop request, profiling).

Checkpoints and the workdir's layout are below it (`flax_transformer.checkpoints`,
`flax_transformer.workdir`): translation reads them too.

The loop that drives them is `flax_transformer.loop` (it also translates, for BLEU).
"""
