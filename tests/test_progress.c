/* The load's progress bar (src/progress.c) under a fake clock: silent for the first second, at most ten redraws a
 * second after it, its line erased at the end, and its text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "progress.h"

static double fake_now;
static double fake_clock(void) { return fake_now; }

typedef struct {
    char *text;
    size_t len;
    FILE *f;
} capture;

static void capture_open(capture *c)
{
    c->text = NULL, c->len = 0;
    c->f = open_memstream(&c->text, &c->len);
    assert_non_null(c->f);
}

static size_t count_char(capture *c, char ch)
{
    fflush(c->f);
    size_t n = 0;
    for (size_t i = 0; i < c->len; i++) n += c->text[i] == ch;
    return n;
}

static void capture_close(capture *c)
{
    fclose(c->f);
    free(c->text);
}

static void test_quiet_first_second(void **state)
{
    (void)state;
    capture c;
    capture_open(&c);
    llm_progress p;
    llm_progress_init(&p, c.f, fake_clock);
    fake_now = 100.0;
    llm_progress_start(&p, "loading", 1000);
    for (int i = 0; i < 99; i++) {
        fake_now = 100.0 + i * 0.01;
        llm_progress_update(&p, (size_t)i * 10);
    }
    llm_progress_finish(&p); /* a step under a second leaves nothing at all */
    fflush(c.f);
    assert_int_equal(c.len, 0);
    capture_close(&c);
}

static void test_rate_limited_and_erased(void **state)
{
    (void)state;
    capture c;
    capture_open(&c);
    llm_progress p;
    llm_progress_init(&p, c.f, fake_clock);
    fake_now = 0.0;
    llm_progress_start(&p, "loading weights to cuda", 10000000);
    /* an update every millisecond for 5 s: drawn from 1 s on, once per 0.1 s at most */
    for (int ms = 0; ms <= 5000; ms++) {
        fake_now = ms * 1e-3;
        llm_progress_update(&p, (size_t)ms * 2000);
        if (ms == 999) assert_int_equal(count_char(&c, '\r'), 0);
        if (ms == 1000) assert_int_equal(count_char(&c, '\r'), 1);
    }
    const size_t draws = count_char(&c, '\r');
    if (draws < 36 || draws > 41) fail_msg("%zu draws in 4 s", draws);
    assert_int_equal(count_char(&c, '\n'), 0); /* one line, redrawn in place */
    fake_now = 6.0; /* the last draw: 10.00 of 10.00 MB at 6 s */
    llm_progress_update(&p, 10000000);
    fflush(c.f);
    const char *last = strrchr(c.text, '\r');
    assert_string_equal(last, "\rloading weights to cuda 100% [####################] 10.00/10.00 MB, 1.67 MB/s");
    const size_t before = c.len, width = strlen(last + 1);
    llm_progress_finish(&p);
    fflush(c.f);
    /* erased: back to the start, blanks over the whole line, back again */
    assert_int_equal(c.len - before, width + 2);
    assert_int_equal(c.text[before], '\r');
    assert_int_equal(c.text[c.len - 1], '\r');
    for (size_t i = before + 1; i < c.len - 1; i++) assert_int_equal(c.text[i], ' ');
    llm_progress_finish(&p); /* twice: nothing more */
    fflush(c.f);
    assert_int_equal(c.len, before + width + 2);
    capture_close(&c);
}

/* A shorter line drawn over a longer one blanks the rest of it. */
static void test_shorter_line_blanks_the_rest(void **state)
{
    (void)state;
    capture c;
    capture_open(&c);
    llm_progress p;
    llm_progress_init(&p, c.f, fake_clock);
    fake_now = 0.0;
    llm_progress_start(&p, "x", 2000000000);
    fake_now = 1.0;
    llm_progress_update(&p, 1999000000); /* 1999 MB/s */
    fake_now = 2.0;
    llm_progress_update(&p, 1000000); /* 0.00 GB/s: shorter */
    fflush(c.f);
    const char *second = strrchr(c.text, '\r');
    const char *first = c.text;
    assert_int_equal(strlen(second), (size_t)(second - first));
    llm_progress_finish(&p);
    capture_close(&c);
}

static void test_format(void **state)
{
    (void)state;
    char buf[160];
    int n = llm_progress_format(buf, sizeof buf, "loading weights to cuda", 1120000000, 2470000000, 1.2);
    assert_string_equal(buf, "loading weights to cuda  45% [#########           ] 1.12/2.47 GB, 0.93 GB/s");
    assert_int_equal(n, (int)strlen(buf));
    llm_progress_format(buf, sizeof buf, "decompressing model.safetensors.zst", 0, 5000000, 0.0);
    assert_string_equal(buf, "decompressing model.safetensors.zst   0% [                    ] 0.00/5.00 MB");
    llm_progress_format(buf, sizeof buf, "empty", 0, 0, 1.0);
    assert_string_equal(buf, "empty 100% [####################] 0.00/0.00 MB, 0.00 MB/s");
    /* a narrow terminal: the label gives way first, then the end of the rest */
    n = llm_progress_format(buf, 60, "loading weights to cuda", 1120000000, 2470000000, 1.2);
    assert_string_equal(buf, "loading  45% [#########           ] 1.12/2.47 GB, 0.93 GB/s");
    assert_int_equal(n, 59);
    n = llm_progress_format(buf, 12, "loading weights", 1, 2, 1.0);
    assert_int_equal(n, 11);
    assert_string_equal(buf, "  50% [####");
}

/* Through the load's callback: a new name starts a step, done == total ends it (erasing), NULL draws nothing. */
static void test_callback(void **state)
{
    (void)state;
    capture c;
    capture_open(&c);
    llm_progress p;
    llm_progress_init(&p, c.f, fake_clock);
    fake_now = 0.0;
    llm_progress_callback(&p, "decompressing a.zst", 0, 100);
    fake_now = 1.5;
    llm_progress_callback(&p, "decompressing a.zst", 50, 100);
    assert_int_equal(count_char(&c, '\r'), 1);
    llm_progress_callback(&p, "decompressing a.zst", 100, 100); /* ends: erased */
    assert_int_equal(count_char(&c, '\r'), 3);
    assert_int_equal(p.label[0], '\0');
    llm_progress_callback(&p, "loading weights to cuda", 10, 100); /* a new step: its own second of quiet */
    fake_now = 2.0;
    llm_progress_callback(&p, "loading weights to cuda", 20, 100);
    assert_int_equal(count_char(&c, '\r'), 3);
    llm_progress_finish(&p);
    capture_close(&c);

    llm_progress_init(&p, NULL, fake_clock);
    fake_now = 0.0;
    llm_progress_callback(&p, "x", 1, 10);
    fake_now = 5.0;
    llm_progress_callback(&p, "x", 5, 10);
    llm_progress_finish(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quiet_first_second),
        cmocka_unit_test(test_rate_limited_and_erased),
        cmocka_unit_test(test_shorter_line_blanks_the_rest),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_callback),
    };
    return cmocka_run_group_tests_name("progress", tests, NULL, NULL);
}
