"""Multi30k EN, DE and FR (parallel captions): one model for all six directions.

`configs/multi30k.py` (its model, batches and schedule) with `languages='en,de,fr'`: a
shared vocabulary keeping '<2en>', '<2de>', '<2fr>' whole, each target starting with its
language's token (forced as the decoder's first output at translation: run.json's
"languages" record), the directions mixed in every batch (data.multilingual;
--config.pair_temperature, 1 here: Multi30k's six directions are the same size).
`python train.py --config=configs/multi30k_multilingual.py --workdir=DIR`; translate with
decode.py --source_lang=de --target_lang=fr.
"""

from configs import multi30k


def get_config():
  config = multi30k.get_config()
  config.languages = "en,de,fr"
  config.pair_temperature = 1.0
  # Six directions share the steps one pair had: three times the pair's steps, so each
  # direction sees about as many target tokens as the bilingual run's.
  config.num_train_steps = 3 * multi30k.get_config().num_train_steps
  return config
