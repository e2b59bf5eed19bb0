"""ISO 639 codes (what LibreTranslate's clients send) <-> models' codes (NLLB-200's
eng_Latn, M2M100's en): flax_transformer.language_codes, against ISO 639's own tables
(639-1 two-letter codes of the 639-3 languages NLLB names) and the scripts CLDR gives."""

import pytest

from flax_transformer import language_codes
from flax_transformer.languages import Languages, UnknownLanguageError
from flax_transformer.pretrained.m2m100_tokenizer import M2M100_CODES

# A slice of NLLB-200's codes (transformers' FAIRSEQ_LANGUAGE_CODES), with the two-script
# and macrolanguage cases.
NLLB = ["eng_Latn", "deu_Latn", "fra_Latn", "zho_Hans", "zho_Hant", "yue_Hant", "arb_Arab",
        "arb_Latn", "ars_Arab", "zsm_Latn", "pes_Arab", "aka_Latn", "twi_Latn", "srp_Cyrl",
        "kas_Arab", "kas_Deva", "ace_Arab", "ace_Latn", "nob_Latn", "swh_Latn"]


def test_iso_forms_of_nllb_codes():
  table = language_codes.aliases(NLLB)
  # ISO 639-1 where the language (or its macrolanguage) has one; a second script named.
  assert {code: form for form, code in table.items()} == {
      "eng_Latn": "en", "deu_Latn": "de", "fra_Latn": "fr", "zho_Hans": "zh",
      "zho_Hant": "zh-Hant", "yue_Hant": "yue", "arb_Arab": "ar", "arb_Latn": "ar-Latn",
      "ars_Arab": "ars", "zsm_Latn": "ms", "pes_Arab": "fa", "aka_Latn": "ak",
      "twi_Latn": "tw", "srp_Cyrl": "sr", "kas_Arab": "ks", "kas_Deva": "ks-Deva",
      "ace_Arab": "ace-Arab", "ace_Latn": "ace", "nob_Latn": "nb", "swh_Latn": "sw"}


def test_both_forms_resolve_in_any_spelling():
  for asked, want in (("en", "eng_Latn"), ("eng_Latn", "eng_Latn"), ("EN", "eng_Latn"),
                      ("zh", "zho_Hans"), ("zh-Hant", "zho_Hant"), ("zh_Hant", "zho_Hant"),
                      ("eng", "eng_Latn"), ("xx", None), ("de", "deu_Latn")):
    assert language_codes.resolve(asked, NLLB) == want, asked
  # M2M100's codes are ISO 639-1 already: each is its own form.
  codes = M2M100_CODES["m2m100"]
  assert all(language_codes.resolve(c, codes) == c for c in codes)
  assert language_codes.resolve("__de__", codes) == "de"


def test_listed_gives_the_iso_form_where_one_exists():
  assert language_codes.listed(["eng_Latn", "zho_Hans", "zho_Hant"]) == [
      ("en", "eng_Latn"), ("zh", "zho_Hans"), ("zh-Hant", "zho_Hant")]


def test_a_language_in_one_script_and_codes_with_a_region_resolve():
  """Korean is kor_Hang in NLLB-200, CLDR's usual Korean script Kore: 'ko' (what a
  LibreTranslate client sends) found no code and /languages listed 'ko-Hang' (so the
  language identifier never detected it). Browsers' and Google's codes carry a region:
  'zh-TW' is Traditional, 'zh-CN' Simplified, 'pt-BR' and 'en-US' the language."""
  codes = [*NLLB, "kor_Hang", "por_Latn", "tzm_Tfng", "taq_Latn", "taq_Tfng"]
  for asked, want in (("ko", "kor_Hang"), ("ko-KR", "kor_Hang"), ("zh-TW", "zho_Hant"),
                      ("zh-HK", "zho_Hant"), ("zh-CN", "zho_Hans"), ("pt-BR", "por_Latn"),
                      ("en-US", "eng_Latn"), ("tzm", "tzm_Tfng"), ("taq", "taq_Latn"),
                      ("sr-Latn", None), ("ko-Latn", None)):
    assert language_codes.resolve(asked, codes) == want, asked
  listed = dict((model, shown) for shown, model in language_codes.listed(codes))
  assert (listed["kor_Hang"], listed["tzm_Tfng"], listed["taq_Tfng"]) == ("ko", "tzm",
                                                                           "taq-Tfng")
  assert language_codes.resolve("zh-TW", ["en", "zh"]) is None  # M2M100's zh: one script.


def test_iso_macrolanguage_codes_find_the_nllb_language_in_them():
  """LibreTranslate's clients send ISO 639-1 macrolanguage codes; NLLB-200 names an
  individual language in each (transformers' FAIRSEQ_LANGUAGE_CODES). CLDR folds some
  (arb -> ar) and not others (nob, pbt, quy, fuv): 'no', 'ps', 'qu' and 'ff' found
  nothing. IANA's registry says which macrolanguage each belongs to; Norwegian's two
  go to Bokmål, CLDR's match for 'no'."""
  codes = ["eng_Latn", "nob_Latn", "nno_Latn", "pbt_Arab", "quy_Latn", "fuv_Latn",
           "zsm_Latn", "min_Latn", "arb_Arab", "ars_Arab", "pes_Arab", "prs_Arab",
           "est_Latn", "lvs_Latn", "ltg_Latn", "swh_Latn", "uzn_Latn", "zho_Hans", "zho_Hant",
           "yue_Hant", "bos_Latn", "hrv_Latn", "srp_Cyrl"]
  for asked, want in (("no", "nob_Latn"), ("no-NO", "nob_Latn"), ("nb", "nob_Latn"),
                      ("nn", "nno_Latn"), ("ps", "pbt_Arab"), ("qu", "quy_Latn"),
                      ("ff", "fuv_Latn"), ("ms", "zsm_Latn"), ("ar", "arb_Arab"),
                      ("fa", "pes_Arab"), ("et", "est_Latn"), ("lv", "lvs_Latn"),
                      ("sw", "swh_Latn"), ("uz", "uzn_Latn"), ("zh", "zho_Hans"),
                      ("sh", None)):  # Serbo-Croatian in Latin: none of the three.
    assert language_codes.resolve(asked, codes) == want, asked
  # The macrolanguage alone: a model with only Nynorsk answers 'no' with it.
  assert language_codes.resolve("no", ["eng_Latn", "nno_Latn"]) == "nno_Latn"


def test_a_macrolanguage_is_not_answered_by_a_regional_member():
  """A model without a macrolanguage's main language does not take the macrolanguage's
  code for a regional member (at 2bf6a75 'zh' was Cantonese, 'ms' Minangkabau, 'et' Võro,
  'ar' Moroccan, 'ku' Central Kurdish): the code is unknown, and the one-line error names
  what the model has."""
  for asked, member in (("zh", "yue_Hant"), ("ms", "min_Latn"), ("et", "vro_Latn"),
                        ("ar", "ary_Arab"), ("ku", "ckb_Arab")):
    codes = ("eng_Latn", member)
    assert language_codes.resolve(asked, codes) is None, asked
    model = Languages(sources=codes, targets=codes, target_by="decoder_prefix",
                      target_tokens={c: c for c in codes}, source_tokens={c: c for c in codes})
    with pytest.raises(UnknownLanguageError, match=(
        rf"^the model does not translate into '{asked}': it knows eng_Latn -> {member}; "
        rf"{member} -> eng_Latn$")):
      model.check_pair("eng_Latn", asked)


def test_pashto_is_southern_pashto_where_a_model_has_both():
  """'ps' on a model with Southern (pbt_Arab, NLLB-200's, the one with data) and Northern
  (pbu_Arab, which CLDR folds into 'ps') Pashto: Southern, in either order, and
  /languages lists it as 'ps' (the served table resolves the same); Northern alone
  still answers 'ps'."""
  for codes in (["eng_Latn", "pbt_Arab", "pbu_Arab"], ["eng_Latn", "pbu_Arab", "pbt_Arab"]):
    assert language_codes.resolve("ps", codes) == "pbt_Arab"
    listed = language_codes.listed(codes)
    assert dict(listed)["ps"] == "pbt_Arab" and dict(listed)["pbu"] == "pbu_Arab"
    assert language_codes.resolve("ps", codes, dict(listed)) == "pbt_Arab"
  assert language_codes.resolve("ps", ["eng_Latn", "pbu_Arab"]) == "pbu_Arab"
