"""Training: sharding, the jitted steps, checkpoints, metrics, and the workdir on disk.

The loop that drives them is `flax_transformer.loop` (it also translates, for BLEU).
"""
