/* Tensor parallelism's split of a model (Megatron's): which share of every layer's products a rank keeps. q, k, v
 * (and their biases) and gate, up are cut by output rows, whole heads and the intermediate size; o and down by input
 * columns, so that each rank's o and down give a part of the whole product and the all_reduce op sums them. A sparse
 * layer's experts are split whole (expert parallelism): each rank keeps a range of them, the router whole, so every
 * rank routes alike and computes only its own experts' picks (the experts op's zero for the others: ops.h), and the
 * all-reduce after the combine adds the ranks' parts; a shared expert is cut as the dense feed-forward is. The head
 * is cut by vocabulary rows, and the all_gather op puts the ranks' logits together. The embeddings and the norms are
 * whole on every rank. Pure arithmetic: tests/test_tp.c checks it on the CPU.
 * Not here: loading the rows (model.c), starting the ranks (src/tp.c). */
#ifndef LLM_SPLIT_H
#define LLM_SPLIT_H

#include <stddef.h>

#include "config.h"

/* What rank `rank` of `size` keeps: heads [head0, head0 + heads) of the query heads, KV heads [kv0, kv0 + kv_heads),
 * rows [inter0, inter0 + inter) of the feed-forward's intermediate size and [vocab0, vocab0 + vocab) of the head.
 * With fewer KV heads than ranks each KV head is kept by size / n_kv_heads ranks in a row: those whose query heads
 * read it. In a mixture of experts, also experts [expert0, expert0 + experts) of every sparse layer and rows
 * [shared0, shared0 + shared) of a shared expert's intermediate size (both 0 in a dense model). */
typedef struct {
    int rank, size;
    int head0, heads;
    int kv0, kv_heads;
    int inter0, inter;
    int expert0, experts;
    int shared0, shared;
    int vocab0, vocab; /* the head's rows [vocab0, vocab0 + vocab): llm_split_range over vocab_size, all_gather's */
} llm_split;

/* Rank `rank` of `size` ranks' share of a model of config c (its whole heads and intermediate size), read from
 * folder dir. The query heads must split evenly, and the KV heads either split evenly or divide the ranks; the
 * intermediate size and the vocabulary may split unevenly (rows [r * I / size, (r + 1) * I / size)), and so may the
 * experts, at least one a rank. 0, else err naming config.json and the numbers. */
int llm_split_of(llm_split *s, const llm_config *c, const char *dir, int rank, int size, char *err,
                 size_t err_len);

/* s (llm_split_of's shares) moved onto whole blocks of `block` columns, for weights in a block format (`format`
 * names it in err: "Q8_0"): o and down are cut by input columns, which must fall between blocks. The intermediate
 * rows go in whole blocks (rank r's blocks [r * n / size, (r + 1) * n / size) of n = I / block), and each rank's
 * query heads must be whole blocks of o's columns. A width that is not whole blocks in the model itself is left
 * alone: its matrices are not blocks (--quant keeps them as stored, a pre-quantized one is dequantized on load), so
 * they cut anywhere. block 1: nothing to do. 0, else err naming config.json and the numbers. */
int llm_split_blocks(llm_split *s, const llm_config *c, const char *dir, size_t block, const char *format, char *err,
                     size_t err_len);

/* Rows [first, first + count) of n split over `size` parts, part `rank`: first = rank * n / size. */
void llm_split_range(size_t n, int rank, int size, size_t *first, size_t *count);

#endif
