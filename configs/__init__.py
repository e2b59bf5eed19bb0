"""ml_collections configs: `python train.py --config=configs/<name>.py`."""
