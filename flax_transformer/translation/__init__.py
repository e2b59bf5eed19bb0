"""Translation: the model-agnostic search (`search`), length-bucketed batches
(`batching`) and text in, text out (`translator`)."""
