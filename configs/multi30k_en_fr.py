"""Multi30k EN->FR: `configs/multi30k.py` (its model, batches and schedule) with French
targets. `python train.py --config=configs/multi30k_en_fr.py --workdir=DIR`."""

from configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.target_lang = "fr"
  return config
