/* Hugging Face tokenizer.json (model type BPE) in C: load, encode text to ids, decode ids to text, and a
 * streaming decoder for generation. Ids and text equal what the `tokenizers` library produces; the fixtures
 * under tests/fixtures/tokenizers/ are recorded from it. Not here: chat templates (the Jinja text is only
 * exposed), WordPiece / Unigram models (refused at load with a message naming them). */
#ifndef LLM_TOKENIZER_H
#define LLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct llm_tokenizer llm_tokenizer;

/* Loads dir/tokenizer.json, plus dir/tokenizer_config.json and dir/generation_config.json when present.
 * Returns 0, or -1 with one line in err naming the file and the fault. */
int llm_tokenizer_load(llm_tokenizer **out, const char *dir, char *err, size_t err_len);
void llm_tokenizer_free(llm_tokenizer *t); /* accepts NULL */

/* Encodes len bytes of text (not NUL-terminated; invalid UTF-8 is read as U+FFFD, as Python's
 * errors="replace" would). add_special: add BOS/EOS etc. as the post-processor says, or as
 * tokenizer_config.json's add_bos_token / add_eos_token say when it sets them. *ids is malloc'd (the caller
 * frees it; NULL when *n_ids is 0). Returns 0, or -1 with a message (out of memory, regex engine limit). */
int llm_tokenizer_encode(const llm_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                         size_t *n_ids, char *err, size_t err_len);
/* llm_tokenizer_encode of a prompt: with add_special, a text that starts with the BOS token's own text gets no second
 * one (Llama 3's "<|begin_of_text|>..."), as generation without a chat template wants. */
int llm_tokenizer_encode_prompt(const llm_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                                size_t *n_ids, char *err, size_t err_len);

/* Whole decode into a malloc'd NUL-terminated string (NULL only when out of memory). skip_special as in
 * Hugging Face decode(skip_special_tokens=...); ids outside the vocabulary are skipped, as there. The text
 * may hold NUL bytes when a token decodes to one; *out_len (when not NULL) gives the length. */
char *llm_tokenizer_decode(const llm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special);
char *llm_tokenizer_decode_len(const llm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                               size_t *out_len);

/* Streaming decode. Each push returns the text that id completes (often "", e.g. while a UTF-8 character
 * is split over tokens); the returned string lives in d until the next call. After the last id, flush
 * returns what is still held (an incomplete character comes out as U+FFFD). The concatenation of every
 * push and the flush equals llm_tokenizer_decode of all the ids. NULL only when out of memory. */
typedef struct llm_detokenizer llm_detokenizer;
llm_detokenizer *llm_detokenizer_new(const llm_tokenizer *t, bool skip_special);
const char *llm_detokenizer_push(llm_detokenizer *d, int32_t id, size_t *len);
const char *llm_detokenizer_flush(llm_detokenizer *d, size_t *len);
void llm_detokenizer_free(llm_detokenizer *d); /* accepts NULL */

/* One more than the largest id of the vocabulary plus added tokens. */
size_t llm_tokenizer_vocab_size(const llm_tokenizer *t);
/* An added token marked special (what decode's skip_special leaves out). */
bool llm_tokenizer_is_special(const llm_tokenizer *t, int32_t id);
/* Raw vocabulary string of id ("Ġworld", "▁the", "<0x0A>"), NULL when id is not in the vocabulary. */
const char *llm_tokenizer_piece(const llm_tokenizer *t, int32_t id);
/* Id of an exact vocabulary or added-token string, -1 when absent. */
int32_t llm_tokenizer_token_id(const llm_tokenizer *t, const char *piece);

/* From tokenizer_config.json / generation_config.json: BOS id (-1 when none), whether id ends generation
 * (eos_token and every generation_config eos_token_id), the chat template text (NULL when none). */
int32_t llm_tokenizer_bos_id(const llm_tokenizer *t);
bool llm_tokenizer_is_eos(const llm_tokenizer *t, int32_t id);
const int32_t *llm_tokenizer_eos_ids(const llm_tokenizer *t, size_t *n); /* every id is_eos accepts */
const char *llm_tokenizer_chat_template(const llm_tokenizer *t);

/* Offset of the first byte that is not well-formed UTF-8 (overlongs, surrogates and values past U+10FFFF
 * included), or len when the text is valid. Hugging Face tokenizers take text, not bytes: callers check first. */
size_t llm_utf8_invalid_at(const char *text, size_t len);

#endif
