"""The project's own tools, run from the checkout (`python -m tools.NAME`): the docs'
renderer and checker, a trained run's test-set record, learning curves, and the mutation
check. Not part of the installed package; bench/ holds the benchmarks."""
