#pragma once
// A Tokenizer from the vocabulary a GGUF file carries in its metadata (llama.cpp's
// `tokenizer.ggml.*` keys), so that a .gguf model runs without a tokenizer.json.
//
// The metadata is turned into the Hugging Face tokenizer.json and tokenizer_config.json
// that describe the same tokenizer, and those go through Tokenizer::from_parsed: encoding
// and decoding stay in one place, and a GGUF vocabulary gives the ids the model's own
// Hugging Face tokenizer gives.
//
// Vocabularies (`tokenizer.ggml.model`):
// - "llama" (SentencePiece BPE, as transformers' LlamaConverter writes it): BPE with
//   byte_fallback (when the vocabulary has <0xXX> byte tokens) and fuse_unk; Metaspace
//   pre-tokenizer ("▁", prepend_scheme "first", or "never" when
//   tokenizer.ggml.add_space_prefix is false); decoder Replace ▁ -> space, ByteFallback,
//   Fuse, Strip one leading space. Merges come from the scores as transformers'
//   SentencePieceExtractor makes them: a merge (a, b) for every split of a token t into two
//   tokens, ordered by t's score, highest first; equal scores keep token-id order, and the
//   splits of one token are ordered by the ids of (a, b). Without a tokenizer.ggml.*_id key,
//   bos/eos/unk are llama.cpp's defaults 1, 2 and 0; add_bos_token defaults to true.
//   Note: Hugging Face's "first" adds the "▁" only where the text does not already start
//   with a space, and not after a special token; SentencePiece (and llama.cpp) always add it.
// - "gpt2" (byte-level BPE): vocabulary and tokenizer.ggml.merges ("left right"), the
//   pre-tokenizer of the family named by tokenizer.ggml.pre, as its tokenizer.json spells it:
//   default/gpt-2/phi-2 (GPT-2's), llama-bpe/llama3/llama-v3/falcon3/pixtral, dbrx (Phi-4's),
//   qwen2/deepseek-r1-qwen (with NFC), tekken (Mistral Nemo's), bloom, stablelm2, falcon,
//   starcoder/refact, smollm, gpt-4o. An absent key is "default", taken as GPT-2's regex
//   (llama.cpp's own "default" splits more finely). ByteLevel decoding. add_bos_token and
//   clean_up_tokenization_spaces default to llama.cpp's choice for the family (BOS for Llama 3).
// Any other model ("bert", "t5", "rwkv", ...) and any other pre-tokenizer is refused.
//
// Both kinds: tokens of type control (3) and unknown (2) become special added tokens,
// user-defined (4) non-special added tokens, all matched in the raw text before the
// model as llama.cpp and transformers do; unused (5) tokens stay ordinary vocabulary.
// bos/eos/unknown/padding ids, add_bos_token / add_eos_token and tokenizer.chat_template
// go into the config. Other special ids (eot, sep, fim, ...) are not read here.
//
// Every error is one line naming the file and the key: missing keys, values of the wrong
// type, arrays of different lengths, token types outside 1..6, empty, duplicate or
// non-UTF-8 tokens, NaN scores, ids outside the vocabulary, malformed merges.
#include <memory>

#include "common/gguf/gguf_file.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace tessera {

StatusOr<std::unique_ptr<Tokenizer>> tokenizer_from_gguf(const GgufFile& file);

}  // namespace tessera
