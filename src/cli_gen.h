/* What `llm-run MODEL` (cmd_generate.c) and `llm-run chat` (cmd_chat.c) share: their model, device and sampling flags,
 * and opening a model with its tokenizer, chat template and a session set up from those flags. Not here: the loop
 * (session.h), the template engine (tokenizer/chat.h). */
#ifndef LLM_CLI_GEN_H
#define LLM_CLI_GEN_H

#include <argtable2.h>
#include <jansson.h>
#include <stdbool.h>

#include "model/model.h"
#include "session.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#define LLM_GEN_MAX_PINS 16

typedef struct {
    struct arg_file *model_pos, *model_opt;
    struct arg_int *ctx, *batch, *top_k, *seed, *threads, *repeat_last_n;
    struct arg_dbl *temp, *top_p, *min_p, *repeat_penalty, *presence_penalty, *frequency_penalty;
    struct arg_str *device, *op_device, *system, *stop, *quant, *cache_type, *precision;
    struct arg_lit *ignore_eos, *special, *escape, *no_escape, *quant_head, *cpu_moe;
    struct arg_int *n_cpu_moe, *tp;
    struct arg_str *tp_listen;
} llm_gen_flags;

/* Creates the flags and appends them to table at *n (about 25 entries): the model's, then the command's own (n_own
 * entries of own), then the rest. */
void llm_gen_flags_add(llm_gen_flags *f, void **table, int *n, void *const *own, int n_own);

/* A model opened for generating text. */
typedef struct {
    llm_model model;
    llm_tokenizer *tok;           /* NULL when not asked for */
    llm_chat_template *tmpl;      /* NULL when the model has none (or it was not asked for) */
    llm_session_options so;       /* from the flags */
    char *system;                 /* --system, escapes processed; NULL when not given */
    double load_s;
} llm_gen;

/* The model path from the flags, or NULL. */
const char *llm_gen_model_path(const llm_gen_flags *f);

/* Loads the model (its progress and device choice on stderr), and the tokenizer and chat template when
 * want_tokenizer; fills g->so from the flags, the model's generation_config.json and llama.cpp's defaults, in that
 * order. 0, or -1 with err. */
int llm_gen_open(llm_gen *g, const llm_gen_flags *f, bool want_tokenizer, char *err, size_t err_len);
void llm_gen_close(llm_gen *g);

/* Text encoded as the model's input without a template: BOS etc. as the tokenizer adds them (unless no_bos), but
 * never a second BOS when the text already begins with it. *ids malloc'd. Returns the count, or -1 with err. */
int llm_gen_encode_raw(const llm_gen *g, const char *text, size_t len, bool no_bos, int32_t **ids, char *err,
                       size_t err_len);

/* messages rendered by the chat template (add_generation_prompt) and encoded as transformers does, with no special
 * tokens added (a template that writes the BOS text gets one BOS). Returns the count, or -1 with err. */
int llm_gen_encode_chat(const llm_gen *g, const json_t *messages, int32_t **ids, char *err, size_t err_len);

/* {"role": role, "content": content} appended to messages. 0, or -1 (out of memory). */
int llm_gen_add_message(json_t *messages, const char *role, const char *content);

#endif
