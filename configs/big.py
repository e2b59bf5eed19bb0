"""The paper's big model on WMT14 EN-DE (Table 3, last row; 300K steps).

N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (0.1 for EN-FR).
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.d_model = 1024
  config.model.d_ff = 4096
  config.model.num_heads = 16
  config.model.dropout_rate = 0.3
  config.num_train_steps = 300_000
  return config
