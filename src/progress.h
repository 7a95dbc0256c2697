/* A progress bar on one line of a terminal for the slow steps of loading a model (decompressing a .zst checkpoint,
 * placing weights on a device): nothing until a step has run for a second, then at most ten redraws a second, and
 * the line erased when the step ends. Not here: whether stderr is a terminal (the caller passes NULL when not). */
#ifndef LLM_PROGRESS_H
#define LLM_PROGRESS_H

#include <stddef.h>
#include <stdio.h>

#define LLM_PROGRESS_DELAY_S 1.0    /* a step quicker than this draws nothing */
#define LLM_PROGRESS_INTERVAL_S 0.1 /* between two redraws, at least */

typedef struct {
    FILE *out;              /* NULL: draws nothing */
    double (*clock)(void);  /* seconds; NULL = the monotonic clock (tests give a fake one) */
    char label[64];         /* the step's name, empty between steps */
    size_t total;
    double start, drawn_at; /* when the step began; when the bar was last drawn (< 0: not drawn this step) */
    int width;              /* characters of the line drawn, to erase */
    int columns;            /* the terminal's width (80 when it cannot be asked) */
} llm_progress;

/* out: where to draw (stderr when it is a terminal), or NULL. */
void llm_progress_init(llm_progress *p, FILE *out, double (*clock)(void));
/* Begins a step of total bytes (ending any step still running). */
void llm_progress_start(llm_progress *p, const char *label, size_t total);
/* done of total bytes through; draws when due. */
void llm_progress_update(llm_progress *p, size_t done);
/* Ends the step: the bar's line is erased if it was drawn. Safe to call when no step runs. */
void llm_progress_finish(llm_progress *p);

/* llm_load_options' progress callback (llm_progress_fn), user an llm_progress: a new `what` starts a step, done ==
 * total ends it. Call llm_progress_finish after the load, failed or not, before printing anything. */
void llm_progress_callback(void *user, const char *what, size_t done, size_t total);

/* The bar's text into buf (at most n - 1 characters, the label shortened first; always terminated), e.g.
 * "loading weights to cuda  45% [#########           ] 1.12/2.47 GB, 0.93 GB/s"; returns its length. */
int llm_progress_format(char *buf, size_t n, const char *label, size_t done, size_t total, double elapsed);

#endif
