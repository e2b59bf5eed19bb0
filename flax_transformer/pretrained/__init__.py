"""Pretrained translation models in the transformers format, imported as workdirs.

`import_model.py --from=DIR --workdir=W` turns a transformers folder (config.json,
model.safetensors, the tokenizer's files) into a workdir that decode.py, serve.py,
export.py, average_checkpoints.py and `Translator.from_workdir` use unchanged.
One module per architecture (`marian`, `fsmt`) maps its config and weights; the
shared part (`convert`) reads the folder (safetensors' numpy API, no torch),
permutes vocabularies, and writes the workdir. The design every importer follows:

Ids. The project's convention holds exactly in an imported model: pad 0, EOS 1
(unknown 2 where the vocabulary has one), masks are `ids != 0`, and the decoder's
first input is the shifted-in 0. `convert.project_order(pieces, pad=, eos=, unk=)`
gives the permutation: new id i is old id order[i], pad, EOS, unk first, the rest
in their old order. Embedding rows (each side's own) and `final_logits_bias` are
permuted with it, and the workdir's vocabulary files hold the permuted ids. A
model whose decoder starts from another token than pad (FSMT: EOS) sets
`decoder_start_id` to that token's new id: the decoder embeds the shifted-in 0 as
it, which is exact under causal masking.

Model config (`TransformerConfig`), each difference a field whose default is the
paper's: `activation` ('relu' | 'swish' | 'gelu' | 'gelu_tanh'), `scale_embedding`,
`position_layout` ('interleaved' | 'halves'), `position_frequencies` ('paper' |
'fairseq'), `position_offset`, `attention_bias`, `final_logits_bias`,
`layer_norm_epsilon`, `share_embeddings`, `source_vocab_size` (encoder side; None =
`vocab_size`, which is the target side), `tie_target_embedding` (separate
embeddings, the target one also the pre-softmax matrix), `decoder_start_id`,
`max_len` (max_position_embeddings), `vocab_padding` and `source_vocab_padding` (each
vocabulary padded to split over a tensor axis: `vocab_padding.py`, every import's one
path; exports drop the rows). Imported parameters are placed in the tree
the config builds (`network.model.abstract_params`), so they carry its logical axes and
shard as trained ones do.

Tokenizer. An imported workdir keeps its tokenizer's files under
`<workdir>/tokenizer/` (`Workdir.tokenizer_dir`) and run.json's "tokenizer" entry
names its kind and files ({"kind": "marian", "files": [...], ...}; `tokenizers.KINDS`
maps a kind to its loader, `workdir.tokenizer_files` lists the files a copy of the
workdir needs); `tokenizers.load` builds it, a `tokenizers.PairTokenizer`. Every
tokenizer (the trained `data.tokenizer.Tokenizer` too) has a `source` and a
`target` side, each with `tokenize(text) -> int32 ids + EOS`, `detokenize(ids)`,
`pieces(ids)`, `vocab_size`; translation tokenizes sources with `source`, targets
(--prefix, --score) with `target`, and detokenizes outputs with `target`.

Workdir. run.json as train.py writes it ("model", "vocab_size", "launches") plus
"tokenizer" and "imported_from" (architecture, the folder, the sha256 of each of
its files); the parameters as an orbax checkpoint at step 0 in the layout
train.py saves ({'params': ...} under 'state'), so every command loads them.

Search. transformers and fairseq let a beam hypothesis end only among a step's K best
candidates: `SearchConfig(eos_within_beam=True)` (decode.py --eos_within_beam); at
alpha=0 (length_penalty=0) the two searches then agree (tests/test_pretrained.py).
"""
