/* Tensor parallelism's shares (split.h): which heads and intermediate rows a rank keeps. */
#include "split.h"

#include <stdio.h>

void llm_split_range(size_t n, int rank, int size, size_t *first, size_t *count)
{
    size_t a = n * (size_t)rank / (size_t)size, b = n * (size_t)(rank + 1) / (size_t)size;
    *first = a, *count = b - a;
}

int llm_split_of(llm_split *s, const llm_config *c, const char *dir, int rank, int size, char *err, size_t err_len)
{
    int H = c->num_attention_heads, KV = c->num_key_value_heads, I = c->intermediate_size;
    if (size < 1 || rank < 0 || rank >= size) {
        snprintf(err, err_len, "tensor parallelism: rank %d of %d ranks", rank, size);
        return -1;
    }
    if (H % size) {
        snprintf(err, err_len, "%s/config.json: num_attention_heads %d does not split over %d GPUs (whole heads a "
                 "GPU)", dir, H, size);
        return -1;
    }
    if (KV % size && size % KV) {
        snprintf(err, err_len, "%s/config.json: num_key_value_heads %d does not split over %d GPUs (a multiple of "
                 "them, or a divisor to replicate)", dir, KV, size);
        return -1;
    }
    if (I < size) {
        snprintf(err, err_len, "%s/config.json: intermediate_size %d is smaller than %d GPUs", dir, I, size);
        return -1;
    }
    if (c->n_sparse && c->num_experts < size) {
        snprintf(err, err_len, "%s/config.json: %s %d is fewer than %d GPUs (whole experts a GPU)", dir,
                 c->family->moe.count_key, c->num_experts, size);
        return -1;
    }
    int SI = c->n_sparse ? c->shared_expert_intermediate_size : 0;
    if (SI && SI < size) {
        snprintf(err, err_len, "%s/config.json: shared_expert_intermediate_size %d is smaller than %d GPUs", dir, SI,
                 size);
        return -1;
    }
    if (c->vocab_size < size) {
        snprintf(err, err_len, "%s/config.json: vocab_size %d is smaller than %d GPUs", dir, c->vocab_size, size);
        return -1;
    }
    s->rank = rank, s->size = size;
    s->heads = H / size, s->head0 = rank * s->heads;
    if (KV % size == 0) {
        s->kv_heads = KV / size, s->kv0 = rank * s->kv_heads;
    } else { /* each KV head replicated on size / KV ranks: those whose query heads share it */
        s->kv_heads = 1, s->kv0 = rank / (size / KV);
    }
    size_t first, count;
    llm_split_range((size_t)I, rank, size, &first, &count);
    s->inter0 = (int)first, s->inter = (int)count;
    llm_split_range((size_t)c->vocab_size, rank, size, &first, &count);
    s->vocab0 = (int)first, s->vocab = (int)count;
    s->expert0 = s->experts = s->shared0 = s->shared = 0;
    if (c->n_sparse) {
        llm_split_range((size_t)c->num_experts, rank, size, &first, &count);
        s->expert0 = (int)first, s->experts = (int)count;
        llm_split_range((size_t)SI, rank, size, &first, &count);
        s->shared0 = (int)first, s->shared = (int)count;
    }
    return 0;
}

int llm_split_blocks(llm_split *s, const llm_config *c, const char *dir, size_t block, const char *format, char *err,
                     size_t err_len)
{
    size_t I = (size_t)c->intermediate_size, q_dim = (size_t)c->num_attention_heads * (size_t)c->head_dim;
    size_t o_cols = (size_t)s->heads * (size_t)c->head_dim;
    if (block <= 1) return 0;
    if (q_dim % block == 0 && o_cols % block) {
        snprintf(err, err_len, "%s/config.json: num_attention_heads %d over %d GPUs gives each %zu columns of o_proj "
                 "(head_dim %d), not whole blocks of %zu (%s)", dir, c->num_attention_heads, s->size, o_cols,
                 c->head_dim, block, format);
        return -1;
    }
    if (I % block) return 0;
    if (I / block < (size_t)s->size) {
        snprintf(err, err_len, "%s/config.json: intermediate_size %zu holds fewer blocks of %zu (%s) than %d GPUs "
                 "(whole blocks a GPU)", dir, I, block, format, s->size);
        return -1;
    }
    size_t first, count;
    llm_split_range(I / block, s->rank, s->size, &first, &count);
    s->inter0 = (int)(first * block), s->inter = (int)(count * block);
    return 0;
}
