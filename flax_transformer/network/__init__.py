"""The network: the paper's Transformer as Flax modules (config, attention, layers, model).

Imports nothing of data, training or translation.
"""
