"""Reading XLA's compiled HLO text (`jitted.lower(...).compile().as_text()`): what the tests
of the search's compiled step loop look into."""

from __future__ import annotations

import re


def while_loop_body(hlo: str) -> list[str]:
  """The instructions of the largest while loop's body in compiled HLO text: a search's
  step loop (the others: its backtracking, XLA's own loops; their order varies)."""
  computations, name = {}, None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
    if header:
      name = header[1]
      computations[name] = []
    elif line.startswith("}"):
      name = None
    elif name and line.strip().startswith(("%", "ROOT")):
      computations[name].append(line.strip())
  bodies = [re.search(r"body=%([^\s,]+)", line)[1]
            for lines in computations.values() for line in lines if " while(" in line]
  return computations[max(bodies, key=lambda body: len(computations[body]))]
