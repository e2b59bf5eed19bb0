"""The keys transformers itself writes into every model folder's config.json and
tokenizer_config.json (not one architecture's fields: those are `marian.FIELDS`,
`fsmt.FIELDS`), each with what it means for an import: a reason where it leaves the
translations unchanged (bookkeeping, output switches, generate()'s settings, the
classification head), a rule (value -> None, or why the value is refused) where it
changes them.

Derived from transformers 4.57.6 and 5.24.0: tests/fixtures/hub_keys.py lists, in a
venv of each, the keys of a default PretrainedConfig's to_dict() and attributes, the
kwargs transformers' configuration and tokenizer modules pop (what a saved file can carry
back into them), and the keys save_pretrained writes for MarianTokenizer and
FSMTTokenizer; it fails naming any key that is neither here nor an architecture's field.
Keys of older releases found in the hub's 2020-21 OPUS-MT uploads are here too.
"""

from __future__ import annotations

from typing import Any, Callable

Rule = Callable[[Any], "str | None"]


def must_be(*allowed) -> Rule:
  """A field this code implements only at these values: a problem otherwise."""
  return lambda value: None if value in allowed else f"only {' or '.join(map(repr, allowed))}"


def special_token(*contents) -> Rule:
  """A special token's entry: its text, as transformers writes it, or the object 4.x
  releases wrote for an AddedToken ({"__type": "AddedToken", "content": ...}) where it
  strips nothing around itself and matches inside words (what the text alone means)."""
  def rule(value):
    if isinstance(value, dict):
      plain = not any(value.get(flag) for flag in ("lstrip", "rstrip", "single_word"))
      value = value.get("content") if plain else value
    return None if value in contents else f"only {' or '.join(map(repr, contents))}"
  return rule


def refused(why: str) -> Rule:
  """A key whose every value changes the function in a way not implemented here."""
  return lambda value: why


_BOOKKEEPING = "bookkeeping"
_SEARCH = "generate()'s setting: the search here is SearchConfig's (decode.py's flags)"
_HEAD = "classification head: not used in translation"
_LOADING = "from_pretrained's or save_pretrained's argument, not a setting of the model"
_SWITCH = "output switch: what forward() returns, not its values"

# config.json keys of every transformers model.
CONFIG_KEYS: dict[str, Rule | str] = {
    "_name_or_path": _BOOKKEEPING, "transformers_version": _BOOKKEEPING,
    "_commit_hash": _BOOKKEEPING, "name_or_path": _BOOKKEEPING, "_post_init_done": _BOOKKEEPING,
    "finetuning_task": _BOOKKEEPING, "xla_device": "TPU placement (transformers 3)",
    "architectures": "checked by the importer", "model_type": "checked by the importer",
    "dtype": "parameters are stored as float32", "torch_dtype": "parameters are stored as "
    "float32", "use_bfloat16": "TensorFlow's dtype switch: parameters are stored as float32",
    "tf_legacy_loss": "TensorFlow's training loss", "use_cache": "inference switch (caches "
    "keys and values), same function", "output_past": "transformers 3's name of use_cache",
    "return_dict": _SWITCH, "output_hidden_states": _SWITCH, "output_attentions": _SWITCH,
    "_output_attentions": _SWITCH, "torchscript": "export switch",
    "gradient_checkpointing": "training memory switch",
    "chunk_size_feed_forward": "memory switch, same function",
    "_attn_implementation": "attention kernel (eager, sdpa, flash): same function",
    "_attn_implementation_internal": "attention kernel: same function",
    "_attn_implementation_autoset": "attention kernel: same function",
    "attn_implementation": "attention kernel: same function",
    "_experts_implementation_internal": "mixture-of-experts kernel: no experts here",
    "experts_implementation": "mixture-of-experts kernel: no experts here",
    "pruned_heads": must_be({}), "tie_encoder_decoder": must_be(False),
    "is_decoder": must_be(False), "add_cross_attention": "decoder-only models' switch",
    "cross_attention_hidden_size": "EncoderDecoderModel's: equal to d_model here",
    "quantization_config": refused("quantized weights: save the model unquantized "
                                   "(float32 or float16) and import that"),
    "id2label": _HEAD, "label2id": _HEAD, "_num_labels": _HEAD, "num_labels": _HEAD,
    "classif_dropout": _HEAD, "classifier_dropout": _HEAD, "problem_type": _HEAD,
    "tokenizer_class": "the tokenizer is imported from its files",
    "prefix": "a pipeline's text prefix", "task_specific_params": "pipelines' settings",
    "bos_token_id": "no BOS token is used", "sep_token_id": "not used",
    **{name: _LOADING for name in (
        "_configuration_file", "_from_auto", "_from_pipeline", "cache_dir", "commit_message",
        "force_download", "local_files_only", "proxies", "repo_id", "return_unused_kwargs",
        "revision", "subfolder", "token", "trust_remote_code", "use_auth_token",
        "resume_download", "per_layer_config", "auto_map")},
    **{name: _SEARCH for name in (
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
        "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
        "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
        "output_scores", "return_dict_in_generate", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens", "max_new_tokens", "generation_config")},
}

# tokenizer_config.json keys of every tokenizer (PreTrainedTokenizerBase's): those an
# architecture's tokenizer reads itself are in its TOKENIZER_FIELDS.
TOKENIZER_KEYS: dict[str, Rule | str] = {
    "name_or_path": _BOOKKEEPING, "special_tokens_map_file": _BOOKKEEPING,
    "tokenizer_file": "the fast tokenizer's file: the slow one's files are read",
    "processor_class": _BOOKKEEPING, "backend": _BOOKKEEPING, "files_loaded": _BOOKKEEPING,
    "init_inputs": _BOOKKEEPING, "verbose": "logging switch", "auto_map": _BOOKKEEPING,
    "model_max_length": "truncation is the caller's", "max_len": "model_max_length's old name",
    "padding_side": "batches are padded here by the translator",
    "truncation_side": "truncation is the caller's", "model_input_names": _BOOKKEEPING,
    "padding": "a call's default", "truncation": "a call's default", "max_length": "a call's "
    "default", "max_target_length": "a call's default",
    "token_type_ids_pattern": "token type ids: not a Marian or FSMT input",
    "token_type_ids_include_special_tokens": "token type ids: not a Marian or FSMT input",
    **{name: "chat templates: not used in translation" for name in (
        "chat_template", "response_schema", "response_template", "chat_control_tokens")},
    **{name: _LOADING for name in ("_commit_hash", "_from_auto", "_from_pipeline",
                                   "commit_message", "proxies", "repo_id", "subfolder",
                                   "resume_download", "use_auth_token", "is_local",
                                   "local_files_only")},
    "src_lang": "NLLB's and M2M100's tokenizers' setting: Marian's and FSMT's never read it",
    "tgt_lang": "NLLB's and M2M100's tokenizers' setting: Marian's and FSMT's never read it",
    "use_source_tokenizer": "a decode call's argument, not a setting",
    # Special tokens Marian and FSMT have none of: their text would be cut out of sources.
    "cls_token": must_be(None), "mask_token": must_be(None),
    # Applied on decode as transformers applies it (tokenizers.clean_up_tokenization).
    "clean_up_tokenization_spaces": must_be(True, False, None),  # None: as False there.
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": must_be(False),
    "split_special_tokens": must_be(False),  # True: special tokens' text read as text.
    "special_tokens_pattern": must_be(None),  # Another set of added specials.
    "add_bos_token": refused("adds a BOS token MarianTokenizer and FSMTTokenizer never add"),
    "add_eos_token": refused("changes the EOS MarianTokenizer and FSMTTokenizer always add"),
    "additional_special_tokens": must_be([], None),  # More tokens split out of the text.
    "extra_special_tokens": must_be([], {}, None),
    "model_specific_special_tokens": must_be({}, None),
}
