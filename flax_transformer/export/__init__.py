"""A trained model for use without this package: StableHLO through jax.export, and CTranslate2.

`stablehlo.export_stablehlo` writes the averaged model's encoder and beam search
as serialized StableHLO, one module per batch shape, with its parameters, the
vocabulary, a manifest and `runner.py` (jax, numpy and sentencepiece only) as
`translate.py`. `ct2.convert` writes a CTranslate2 model directory. export.py
is the command for both.
"""
