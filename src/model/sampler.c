/* Samplers. Order as llama.cpp's default chain applies them: penalties, top-k, then softmax at temperature, top-p,
 * min-p, draw; greedy (temp 0) takes the best after the penalties. */
#include "sampler.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

llm_sampling_params llm_sampling_defaults(void)
{
    return (llm_sampling_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64, .presence_penalty = 0.0f, .frequency_penalty = 0.0f, .seed = 0};
}

static bool penalties_on(const llm_sampling_params *p)
{
    return p->repeat_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

static int check_params(const llm_sampling_params *p, int vocab, char *err, size_t err_len)
{
    const char *bad = NULL, *want = NULL;
    double value = 0.0;
#define CHECK(ok, name, v, expected)                                                                                \
    if (!bad && !(ok)) bad = name, value = (double)(v), want = expected
    CHECK(vocab > 0, "vocabulary size", vocab, "at least 1");
    CHECK(isfinite(p->temp), "temp", p->temp, "a finite number (<= 0 = greedy, as in llama.cpp)");
    CHECK(p->top_k >= 0, "top_k", p->top_k, ">= 0 (0 = off)");
    CHECK(p->top_p >= 0.0f && p->top_p <= 1.0f, "top_p", p->top_p, "0..1 (1 = off)");
    CHECK(p->min_p >= 0.0f && p->min_p <= 1.0f, "min_p", p->min_p, "0..1 (0 = off)");
    CHECK(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty), "repeat_penalty", p->repeat_penalty,
          "a finite number > 0 (1 = off)");
    CHECK(p->repeat_last_n >= 0, "repeat_last_n", p->repeat_last_n,
          ">= 0 tokens (0 = off; the whole context is the context size)");
    CHECK(isfinite(p->presence_penalty), "presence_penalty", p->presence_penalty, "a finite number (0 = off)");
    CHECK(isfinite(p->frequency_penalty), "frequency_penalty", p->frequency_penalty, "a finite number (0 = off)");
#undef CHECK
    if (!bad) return 0;
    snprintf(err, err_len, "sampling: %s is %g, expected %s", bad, value, want);
    return -1;
}

int llm_sampler_init(llm_sampler *s, int vocab, const llm_sampling_params *p, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    if (check_params(p, vocab, err, err_len)) return -1;
    s->p = *p;
    s->rng = p->seed ? p->seed : 0x9e3779b97f4a7c15ull;
    s->vocab = vocab;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->spare = malloc((size_t)vocab * sizeof *s->spare);
    bool ok = s->cand && s->spare;
    if (ok && penalties_on(p)) { /* nothing to remember otherwise */
        const size_t last_n = (size_t)p->repeat_last_n;
        s->recent = malloc(last_n * sizeof *s->recent);
        s->count = calloc((size_t)vocab, sizeof *s->count);
        s->penalized = malloc((last_n < (size_t)vocab ? last_n : (size_t)vocab) * sizeof *s->penalized);
        ok = s->recent && s->count && s->penalized;
    }
    if (ok) return 0;
    llm_sampler_free(s);
    snprintf(err, err_len, "sampling: out of memory for a vocabulary of %d and %d recent tokens", vocab,
             p->repeat_last_n);
    return -1;
}

void llm_sampler_free(llm_sampler *s)
{
    free(s->cand), free(s->spare), free(s->recent), free(s->count), free(s->penalized);
    s->cand = s->spare = s->penalized = NULL;
    s->recent = s->count = NULL;
    s->n_recent = s->next = 0;
}

void llm_sampler_accept(llm_sampler *s, int32_t id)
{
    if (!s->recent || id < 0 || id >= s->vocab) return;
    if (s->n_recent == s->p.repeat_last_n)
        s->count[s->recent[s->next]]--; /* the oldest leaves the window */
    else
        s->n_recent++;
    s->recent[s->next] = id;
    s->count[id]++;
    s->next = (s->next + 1) % s->p.repeat_last_n;
}

void llm_sampler_reset(llm_sampler *s)
{
    for (int i = 0; i < s->n_recent; i++) s->count[s->recent[i]] = 0;
    s->n_recent = s->next = 0;
}

/* Scans of vocabularies of 2 x 8,192 or more are split over threads: the logits arrive in memory the CPU has not
 * cached (the device wrote them), and one thread reading Llama 3's 128K (513 KB) took about 100 us a token. On the
 * H100 machine, Llama-3.2-1B generation went 920 -> 988 tok/s greedy, 715-744 -> 892-898 with the default sampling. */
#define PARALLEL_VOCAB 8192
#define MAX_SCAN_THREADS 8

static int scan_threads(int vocab)
{
    int t = vocab / PARALLEL_VOCAB;
    if (t > MAX_SCAN_THREADS) t = MAX_SCAN_THREADS;
    if (t > omp_get_max_threads()) t = omp_get_max_threads();
    return t < 1 ? 1 : t;
}

/* Where thread t of `threads` starts its slice of the vocabulary (thread t + 1's start is its end). */
static int slice_start(int vocab, int t, int threads) { return (int)((int64_t)vocab * t / threads); }

/* The first index of the largest value in [from, to), or -1 when none is above -inf. The maximum comes first, from 8
 * running maxima (a scan that compares with the best so far waits on each comparison: 3-4 ns a value), then its
 * first index; NaNs are never chosen over a number. */
static int32_t argmax_range(const float *logits, int from, int to, float *best_out)
{
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int i = from;
    for (; i + 8 <= to; i += 8)
        for (int j = 0; j < 8; j++) m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j];
    for (; i < to; i++) m[0] = logits[i] > m[0] ? logits[i] : m[0];
    float best = m[0];
    for (int j = 1; j < 8; j++) best = m[j] > best ? m[j] : best;
    *best_out = best;
    for (i = from; i < to; i++)
        if (logits[i] == best) return i;
    return -1;
}

int32_t llm_argmax(const float *logits, int vocab)
{
    const int T = scan_threads(vocab);
    float best[MAX_SCAN_THREADS];
    int32_t at[MAX_SCAN_THREADS];
    for (int t = 0; t < T; t++) at[t] = -1; /* (OpenMP may give fewer threads than asked) */
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), threads = omp_get_num_threads();
        at[t] = argmax_range(logits, slice_start(vocab, t, threads), slice_start(vocab, t + 1, threads), &best[t]);
    }
    int32_t pick = -1;
    for (int t = 0; t < T; t++) /* slices in order: the first of equal maxima wins */
        if (at[t] >= 0 && (pick < 0 || best[t] > logits[pick])) pick = at[t];
    return pick < 0 ? 0 : pick;
}

static float next_uniform(uint64_t *state) /* xorshift64*, 24 random bits into [0, 1) */
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

/* The candidates' order: the larger logit first, equal logits by the lower id (so a draw depends on nothing but the
 * logits and the seed; NaN logits are taken as -inf). */
static bool ahead_of(struct llm_candidate a, struct llm_candidate b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int by_order(const void *a, const void *b)
{
    const struct llm_candidate *x = a, *y = b;
    return ahead_of(*x, *y) ? -1 : ahead_of(*y, *x);
}

static struct llm_candidate candidate(const float *logits, int id)
{
    return (struct llm_candidate){isnan(logits[id]) ? -INFINITY : logits[id], id};
}

/* llama.cpp's penalties for a token seen `count` times among the recent ones (its llama_sampler_penalties_apply). */
static float penalize(const llm_sampling_params *p, float logit, int count)
{
    logit = logit <= 0.0f ? logit * p->repeat_penalty : logit / p->repeat_penalty;
    return logit - ((float)count * p->frequency_penalty + (float)(count > 0) * p->presence_penalty);
}

/* The distinct recent ids with their penalized logits, into s->penalized; returns how many. The caller's logits stay
 * as they are: the samplers below take these in place of the ids' own. Each id is taken once (its count negated
 * while this walks the ring, then restored). */
static int collect_penalized(llm_sampler *s, const float *logits)
{
    int n = 0;
    for (int i = 0; i < s->n_recent; i++) {
        const int32_t id = s->recent[i];
        if (s->count[id] <= 0) continue;
        s->penalized[n++] = (struct llm_candidate){penalize(&s->p, candidate(logits, id).logit, s->count[id]), id};
        s->count[id] = -s->count[id];
    }
    for (int i = 0; i < s->n_recent; i++)
        if (s->count[s->recent[i]] < 0) s->count[s->recent[i]] = -s->count[s->recent[i]];
    return n;
}

/* The k best of logits[from, to) as a heap in heap[0..), its root the last of them; returns how many (at most k).
 * Ids with skip[id] != 0 are left out (skip may be NULL), asked only of a logit that would enter the heap. */
static int heap_of_best(struct llm_candidate *heap, const float *logits, int from, int to, int k, const int32_t *skip)
{
    int n = 0;
    for (int id = from; id < to; id++) {
        const struct llm_candidate c = candidate(logits, id);
        int at;
        if (n < k) { /* sift up from the new leaf */
            if (skip && skip[id]) continue;
            at = n++;
            while (at > 0 && ahead_of(heap[(at - 1) / 2], c)) heap[at] = heap[(at - 1) / 2], at = (at - 1) / 2;
            heap[at] = c;
            continue;
        }
        if (!ahead_of(c, heap[0]) || (skip && skip[id])) continue;
        for (at = 0;;) { /* c replaces the root: sift down */
            int child = 2 * at + 1;
            if (child >= k) break;
            if (child + 1 < k && ahead_of(heap[child], heap[child + 1])) child++;
            if (!ahead_of(c, heap[child])) break;
            heap[at] = heap[child], at = child;
        }
        heap[at] = c;
    }
    return n;
}

/* The candidates in order by a stable radix sort (they start in id order, so equal logits stay by id): each logit's
 * bits become an unsigned key that counts down as the float goes up (-0 taken as +0, which compares equal to it),
 * sorted 11 bits a pass and turned back into the float at the end: 0.4 ms for 32K candidates (1.5 ms for 128K) on
 * the development machine, where qsort with a comparison function took 4.5 ms (20 ms), several times a GPU's decode
 * step. */
static uint32_t descending_key(float logit)
{
    uint32_t u;
    if (logit == 0.0f) logit = 0.0f;
    memcpy(&u, &logit, sizeof u);
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending as the float */
    return ~u;
}

/* The key sort_candidates keeps in a candidate's logit field. */
static uint32_t key_of(const struct llm_candidate *c)
{
    uint32_t key;
    memcpy(&key, &c->logit, sizeof key);
    return key;
}

static float logit_of_key(uint32_t key)
{
    uint32_t u = ~key;
    u = u & 0x80000000u ? u & 0x7fffffffu : ~u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void sort_candidates(struct llm_candidate *cand, struct llm_candidate *spare, int n)
{
    enum { BITS = 11, BUCKETS = 1 << BITS };
    for (int i = 0; i < n; i++) { /* the key in the logit's place while sorting */
        const uint32_t key = descending_key(cand[i].logit);
        memcpy(&cand[i].logit, &key, sizeof key);
    }
    struct llm_candidate *from = cand, *to = spare;
    for (int shift = 0; shift < 32; shift += BITS) {
        int at[BUCKETS + 1] = {0};
        for (int i = 0; i < n; i++) at[(key_of(&from[i]) >> shift & (BUCKETS - 1)) + 1]++;
        for (int d = 0; d < BUCKETS; d++) at[d + 1] += at[d];
        for (int i = 0; i < n; i++) to[at[key_of(&from[i]) >> shift & (BUCKETS - 1)]++] = from[i];
        struct llm_candidate *t = from;
        from = to, to = t;
    }
    for (int i = 0; i < n; i++) /* back from wherever the last pass left them (spare, after three) */
        cand[i] = (struct llm_candidate){logit_of_key(key_of(&from[i])), from[i].id};
}

/* The k candidates ahead of all others, into cand[0..k) in order, the n_pen penalized ones (s->penalized) counted
 * at their penalized logits: each thread keeps a heap of the k best of its slice, penalized ids left out (most
 * logits lose to the root at a glance: 33 us for 32K and k = 40); the threads' heaps are sorted together, and the
 * penalized candidates ahead of the k-th join them. With top-k off (k + n_pen reaching the vocabulary) all are
 * sorted. */
static void top_candidates(llm_sampler *s, const float *logits, int k, int n_pen)
{
    struct llm_candidate *cand = s->cand;
    const int vocab = s->vocab;
    if (k >= vocab - n_pen) {
        for (int id = 0; id < vocab; id++) cand[id] = candidate(logits, id);
        for (int i = 0; i < n_pen; i++) cand[s->penalized[i].id].logit = s->penalized[i].logit;
        sort_candidates(cand, s->spare, vocab);
        return;
    }
    int T = scan_threads(vocab);
    if ((int64_t)T * k > vocab) T = 1;
    const int32_t *skip = n_pen ? s->count : NULL;
    int found[MAX_SCAN_THREADS] = {0};
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), threads = omp_get_num_threads();
        found[t] = heap_of_best(cand + (size_t)t * k, logits, slice_start(vocab, t, threads),
                                slice_start(vocab, t + 1, threads), k, skip);
    }
    int n = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < found[t]; i++) cand[n++] = cand[(size_t)t * k + i];
    qsort(cand, (size_t)n, sizeof *cand, by_order);
    if (!n_pen) return;
    /* (k + n_pen < vocab here, so cand holds the k kept and every penalized one) */
    const bool full = n >= k;
    const struct llm_candidate kth = full ? cand[k - 1] : (struct llm_candidate){0};
    if (full) n = k;
    for (int i = 0; i < n_pen; i++)
        if (!full || ahead_of(s->penalized[i], kth)) cand[n++] = s->penalized[i];
    qsort(cand, (size_t)n, sizeof *cand, by_order);
}

int32_t llm_sampler_sample(llm_sampler *s, const float *logits)
{
    const int n_pen = s->recent ? collect_penalized(s, logits) : 0;
    const llm_sampling_params *p = &s->p;
    if (p->temp <= 0.0f) {
        if (!n_pen) return llm_argmax(logits, s->vocab);
        top_candidates(s, logits, 1, n_pen);
        return s->cand[0].id;
    }

    int n = p->top_k > 0 && p->top_k < s->vocab ? p->top_k : s->vocab;
    top_candidates(s, logits, n, n_pen);

    /* Probabilities at temperature, relative to the best candidate (logit kept as probability from here on). */
    float max = s->cand[0].logit, sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s->cand[i].logit = expf((s->cand[i].logit - max) / p->temp);
        sum += s->cand[i].logit;
    }
    for (int i = 0; i < n; i++) s->cand[i].logit /= sum;

    if (p->top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < n; i++) {
            cum += s->cand[i].logit;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        float threshold = p->min_p * s->cand[0].logit;
        int keep = 1;
        while (keep < n && s->cand[keep].logit >= threshold) keep++;
        n = keep;
    }

    float total = 0.0f;
    for (int i = 0; i < n; i++) total += s->cand[i].logit;
    float r = next_uniform(&s->rng) * total, cum = 0.0f;
    for (int i = 0; i < n; i++) {
        cum += s->cand[i].logit;
        if (r < cum) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}
