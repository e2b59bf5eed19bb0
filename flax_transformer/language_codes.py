"""Language codes as clients write them (ISO 639: 'en', 'de', 'zh'; BCP 47 tags such as
'zh-Hant') and as models know them (NLLB-200: 'eng_Latn', ISO 639-3 plus an ISO 15924
script; M2M100: 'en'; OPUS-MT: 'deu'): one mapping, both forms accepted.

The ISO form of a model's code is langcodes' standard tag of it (language data from CLDR
and the IANA registry): ISO 639-3 individual languages folded into their macrolanguage's
ISO 639-1 code where one exists (arb -> ar, zsm -> ms, pes -> fa), 3-letter codes
otherwise (ace), and the script dropped where it is the language's usual one (CLDR's
likely subtags): 'zho_Hans' is 'zh', 'zho_Hant' is 'zh-Hant', 'srp_Cyrl' is 'sr',
'ace_Latn' 'ace' and 'ace_Arab' 'ace-Arab'. So a language written in two scripts gives
its bare ISO code to its usual script and keeps the script in the other's; a language
the model has in one script only takes its bare code too (kor_Hang: 'ko', though CLDR's
usual Korean script is Kore; listed so). A code with a region is read by the region's
script ('zh-TW' is 'zh-Hant', 'zh-CN' 'zh', 'pt-BR' 'pt'). Where two of
a model's codes would take one form (two varieties folded into one macrolanguage), the
form goes to the code whose own language is the macrolanguage's ISO code, else to none of
them; a code left without one takes its unfolded form where that is free (twi_Latn: 'tw',
as aka_Latn has 'ak').
Four ISO macrolanguage codes that CLDR leaves apart from the NLLB-200 language in them
('no', 'ps', 'qu', 'ff') find it by MACROLANGUAGE_MEMBERS; no other macrolanguage code
answers for a member ('zh' is never Cantonese).

langcodes (PyPI, 3.5.1 tried) is chosen over iso639-lang: it knows scripts, macrolanguage
folding and CLDR's likely scripts, which the NLLB codes need; iso639-lang maps ISO 639
parts only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping


@functools.lru_cache(maxsize=4096)
def iso_form(code: str, macro: bool = True) -> str:
  """The ISO 639 / BCP 47 form of a model's language code ('eng_Latn' -> 'en'; 'en' ->
  'en'; '__en__' -> 'en'); the code itself where langcodes does not parse it. macro:
  individual languages folded into their macrolanguage (twi -> ak; False: twi -> tw)."""
  import langcodes
  tag = code.strip("_").replace("_", "-")
  try:
    language = langcodes.Language.get(langcodes.standardize_tag(tag, macro=macro))
  except (ValueError, LookupError):
    return code
  if language.script and language.language:
    usual = langcodes.Language.get(language.language).maximize().script
    if usual == language.script:
      language = language.update_dict({"script": None})
  return language.to_tag()


def _own_language(code: str) -> str:
  """The language part of `code` in its standard form without macrolanguage folding
  ('arb_Arab' -> 'arb', 'eng_Latn' -> 'en')."""
  import langcodes
  try:
    return langcodes.Language.get(langcodes.standardize_tag(
        code.strip("_").replace("_", "-"))).language or code
  except (ValueError, LookupError):
    return code


def aliases(model_codes: Iterable[str]) -> dict[str, str]:
  """ISO form -> model code, for each of `model_codes` whose form is its own (module
  docstring); codes that are already their ISO form map to themselves."""
  model_codes = list(model_codes)
  by_form: dict[str, list[str]] = {}
  for code in model_codes:
    by_form.setdefault(iso_form(code), []).append(code)
  out = {}
  for form, codes in by_form.items():
    if len(codes) == 1:
      out[form] = codes[0]
    else:
      own = [c for c in codes if _own_language(c) == form.split("-")[0]]
      if len(own) == 1:
        out[form] = own[0]
  for macro in MACROLANGUAGE_MEMBERS.keys() & out.keys():  # 'ps': pbt_Arab's, not pbu_Arab's.
    out[macro] = _in_macrolanguage(macro, model_codes, out) or out[macro]
  for code in set(model_codes) - set(out.values()):  # Unfolded: twi_Latn -> 'tw'.
    form = iso_form(code, macro=False)
    if form not in out and form not in by_form:
      out[form] = code
  languages = [form.split("-")[0] for form in out]
  for form, code in list(out.items()):  # kor_Hang: 'ko-Hang' (CLDR's Korean is Kore), 'ko'.
    language, *rest = form.split("-")
    if len(rest) == 1 and len(rest[0]) == 4 and languages.count(language) == 1:
      out[language] = code
  return out


def resolve(code: str, model_codes: Iterable[str],
            table: Mapping[str, str] | None = None) -> str | None:
  """The model's code for `code` (either form, any case, '-' or '_'), None if the model
  has none. `table`: `aliases(model_codes)`, when the caller keeps one."""
  model_codes = list(model_codes)
  if code in model_codes:
    return code
  lowered = {c.lower(): c for c in model_codes}
  if code.lower() in lowered:
    return lowered[code.lower()]
  table = aliases(model_codes) if table is None else table
  if code in table:
    return table[code]
  form, regionless = iso_form(code), _without_region(code)
  return (_in_macrolanguage(regionless or form, model_codes, table) or table.get(form)
          or table.get(regionless or ""))


# ISO 639-1 macrolanguage codes that CLDR's folding (`iso_form`) leaves apart from the
# individual language NLLB-200 names in them, and the members that count for each,
# preferred first: 'no' is Bokmål, else Nynorsk; 'ps' Southern Pashto (NLLB-200's pbt_Arab,
# the one with data), else Northern. Only these: a macrolanguage whose main language a
# model lacks is not answered by a regional member (zh by yue, ms by min, et by vro, ar by
# ary, ku by ckb), which CLDR's distances do not tell apart from the ones here.
MACROLANGUAGE_MEMBERS = {"no": ("nb", "nn"), "ps": ("pbt", "pbu"), "qu": ("quy",),
                         "ff": ("fuv",)}


def _in_macrolanguage(macro: str, model_codes: list[str],
                      table: Mapping[str, str]) -> str | None:
  """The model's code for one of MACROLANGUAGE_MEMBERS' macrolanguages: the code that is
  the macrolanguage itself where the model has one (pus_Arab for 'ps'), else its first
  member the model has; None for any other code."""
  if macro not in MACROLANGUAGE_MEMBERS:
    return None
  if macro in table and _own_language(table[macro]) == macro:
    return table[macro]
  by_language: dict[str, str] = {}
  for code in model_codes:
    by_language.setdefault(_own_language(code), code)
  return next((by_language[member] for member in MACROLANGUAGE_MEMBERS[macro]
               if member in by_language), None)


def _without_region(code: str) -> str | None:
  """The ISO form of a code with a region, the region's usual script kept where it is not
  the language's: 'zh-TW' -> 'zh-Hant', 'zh-CN' -> 'zh', 'pt-BR' -> 'pt' (None without a
  region)."""
  import langcodes
  try:
    language = langcodes.Language.get(langcodes.standardize_tag(code.replace("_", "-")))
  except (ValueError, LookupError):
    return None
  if not language.territory or not language.language:
    return None
  script = language.script or language.maximize().script
  return iso_form(language.update_dict({"territory": None, "script": script}).to_tag())


def listed(model_codes: Iterable[str]) -> list[tuple[str, str]]:
  """(the code a client sees: its ISO form where the model's code has one, the model's
  code) for each of `model_codes`, in their order: what /languages lists."""
  back: dict[str, str] = {}
  for form, model in aliases(model_codes).items():  # The shortest: 'ko', not 'ko-Hang'.
    if model not in back or len(form) < len(back[model]):
      back[model] = form
  return [(back.get(code, code), code) for code in model_codes]
