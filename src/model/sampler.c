/* Samplers. Order as llama.cpp applies them: top-k, then softmax at temperature, top-p, min-p, draw. */
#include "sampler.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int llm_sampler_init(llm_sampler *s, int vocab, float temp, int top_k, float top_p, float min_p, uint64_t seed)
{
    s->temp = temp;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
    s->vocab = vocab;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    s->spare = malloc((size_t)vocab * sizeof *s->spare);
    if (s->cand && s->spare) return 0;
    llm_sampler_free(s);
    return -1;
}

void llm_sampler_free(llm_sampler *s)
{
    free(s->cand), free(s->spare);
    s->cand = s->spare = NULL;
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

/* The k best of logits[from, to) as a heap in heap[0..), its root the last of them; returns how many (at most k). */
static int heap_of_best(struct llm_candidate *heap, const float *logits, int from, int to, int k)
{
    int n = 0;
    for (int id = from; id < to; id++) {
        const struct llm_candidate c = candidate(logits, id);
        int at;
        if (n < k) { /* sift up from the new leaf */
            at = n++;
            while (at > 0 && ahead_of(heap[(at - 1) / 2], c)) heap[at] = heap[(at - 1) / 2], at = (at - 1) / 2;
            heap[at] = c;
            continue;
        }
        if (!ahead_of(c, heap[0])) continue;
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

/* The k candidates ahead of all others, into cand[0..k) in order: each thread keeps a heap of the k best of its
 * slice (most logits lose to the root at a glance: 33 us for 32K and k = 40), and the threads' heaps are sorted
 * together. With top-k off (k = vocab) they are all sorted. */
static void top_candidates(llm_sampler *s, const float *logits, int k)
{
    struct llm_candidate *cand = s->cand;
    const int vocab = s->vocab;
    if (k >= vocab) {
        for (int id = 0; id < vocab; id++) cand[id] = candidate(logits, id);
        sort_candidates(cand, s->spare, vocab);
        return;
    }
    int T = scan_threads(vocab);
    if ((int64_t)T * k > vocab) T = 1;
    int found[MAX_SCAN_THREADS] = {0};
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = omp_get_thread_num(), threads = omp_get_num_threads();
        found[t] = heap_of_best(cand + (size_t)t * k, logits, slice_start(vocab, t, threads),
                                slice_start(vocab, t + 1, threads), k);
    }
    int n = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < found[t]; i++) cand[n++] = cand[(size_t)t * k + i];
    qsort(cand, (size_t)n, sizeof *cand, by_order);
}

int32_t llm_sampler_sample(llm_sampler *s, const float *logits)
{
    if (s->temp <= 0.0f) return llm_argmax(logits, s->vocab);

    int n = s->top_k > 0 && s->top_k < s->vocab ? s->top_k : s->vocab;
    top_candidates(s, logits, n);

    /* Probabilities at temperature, relative to the best candidate (logit kept as probability from here on). */
    float max = s->cand[0].logit, sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s->cand[i].logit = expf((s->cand[i].logit - max) / s->temp);
        sum += s->cand[i].logit;
    }
    for (int i = 0; i < n; i++) s->cand[i].logit /= sum;

    if (s->top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < n; i++) {
            cum += s->cand[i].logit;
            if (cum >= s->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->min_p > 0.0f) {
        float threshold = s->min_p * s->cand[0].logit;
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
