/* -e's escapes (llm_cli_unescape in src/cli.c) against what llama.cpp's string_process_escapes makes of the same
 * text, worked out by hand, plus \0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"

static void expect(const char *in, const char *want, size_t want_len)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", in);
    const size_t got = llm_cli_unescape(buf);
    if (got != want_len || memcmp(buf, want, want_len) != 0 || buf[got] != '\0')
        fail_msg("'%s': %zu bytes '%.*s', expected %zu", in, got, (int)got, buf, want_len);
}
#define EXPECT(in, want) expect(in, want, sizeof want - 1)

static void test_escapes(void **state)
{
    (void)state;
    EXPECT("", "");
    EXPECT("plain text", "plain text");
    EXPECT("a\\nb\\tc\\rd", "a\nb\tc\rd");
    EXPECT("\\'single\\' \\\"double\\\"", "'single' \"double\"");
    EXPECT("back\\\\slash", "back\\slash");
    EXPECT("\\\\n", "\\n"); /* an escaped backslash, then a plain n */
    EXPECT("\\x41\\x62\\x7e", "Ab~");
    EXPECT("\\xe2\\x82\\xac", "\xe2\x82\xac"); /* a euro sign as UTF-8 bytes */
    EXPECT("\\xFf", "\xff");
    EXPECT("a\\0b", "a\0b");
    EXPECT("\\x00", "\0");
    EXPECT("\\n\\n", "\n\n");
}

/* What is not an escape stays as written, as in llama.cpp. */
static void test_not_escapes(void **state)
{
    (void)state;
    EXPECT("\\q\\a\\e", "\\q\\a\\e");
    EXPECT("end\\", "end\\");      /* a trailing backslash */
    EXPECT("\\x4", "\\x4");        /* one hex digit, at the end */
    EXPECT("\\x4g", "\\x4g");      /* one hex digit, then not one */
    EXPECT("\\xg1", "\\xg1");
    EXPECT("\\x", "\\x");
    EXPECT("\\x414", "A4");       /* two digits, no more */
    EXPECT("\\\\\\", "\\\\");     /* an escaped backslash, then a trailing one */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_not_escapes),
    };
    return cmocka_run_group_tests_name("escape", tests, NULL, NULL);
}
