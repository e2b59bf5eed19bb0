"""The paper's base model on WMT14 EN-DE (Table 3, first row; 100K steps)."""

from configs import default


def get_config():
  return default.get_config()
