"""Data: the shared vocabulary (tokenizer), corpora (sources), grain pipelines (pipeline)."""
