/* The helpers every loader reads untrusted files through (src/model/files.c): regular files only, size caps, the
 * 64-bit-overflow fallback of llm_json_load with llm_json_int's checks, and the escaping of file bytes in messages. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/files.h"
#include "support/st_writer.h"

static void test_escape(void **state)
{
    (void)state;
    char out[64];
    assert_string_equal(llm_escape(out, sizeof out, "plain", 5, 60), "plain");
    assert_string_equal(llm_escape(out, sizeof out, "a\nb\t\"c\\", 7, 60), "a\\nb\\t\\\"c\\\\");
    assert_string_equal(llm_escape(out, sizeof out, "\x1b[2J\x7f", 5, 60), "\\x1b[2J\\x7f");
    /* valid UTF-8 kept, invalid bytes (a lone continuation, an overlong, a surrogate) shown as \xNN */
    assert_string_equal(llm_escape(out, sizeof out, "caf\xc3\xa9 \x80 \xc0\xaf \xed\xa0\x80", 14, 60),
                        "caf\xc3\xa9 \\x80 \\xc0\\xaf \\xed\\xa0\\x80");
    /* NUL bytes inside the length are shown, not taken as the end */
    assert_string_equal(llm_escape(out, sizeof out, "a\0b", 3, 60), "a\\x00b");
    /* cut at max with "...", never inside a character or an escape */
    assert_string_equal(llm_escape(out, sizeof out, "abcdefghij", 10, 8), "abcde...");
    assert_string_equal(llm_escape(out, sizeof out, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 8, 7), "\xc3\xa9\xc3\xa9...");
    assert_string_equal(llm_escape(out, sizeof out, "\n\n\n\n", 4, 7), "\\n\\n...");
    assert_string_equal(llm_escape(out, 6, "abcdefghij", 10, 60), "ab...");
    char one[1];
    assert_string_equal(llm_escape(one, sizeof one, "abc", 3, 60), "");
}

static void test_one_line(void **state)
{
    (void)state;
    char msg[] = "file: \"x\nllm-run: forged\" \xff\xfe caf\xc3\xa9\r";
    llm_message_one_line(msg);
    assert_string_equal(msg, "file: \"x?llm-run: forged\" ?? caf\xc3\xa9?");
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_json_int(void **state)
{
    char *dir = *state, path[4096], err[256];
    snprintf(path, sizeof path, "%s/t.json", dir);
    /* a key past 64 bits: the file loads (every integer a real), and the keys read are checked */
    write_file(path, "{\"model_max_length\": 1000000000000000019884624838656, \"a\": 7, \"b\": 4294967304, \"c\": 1.5,"
                     " \"d\": \"7\", \"e\": null, \"f\": -3}");
    json_t *j = llm_json_load(path, 0, true, err, sizeof err);
    assert_non_null(j);
    int64_t x = 0;
    assert_int_equal(llm_json_int(j, "a", 0, 10, &x, "t.json", err, sizeof err), 0);
    assert_int_equal(x, 7);
    assert_int_equal(llm_json_int(j, "b", 0, INT32_MAX, &x, "t.json", err, sizeof err), -1);
    assert_string_equal(err, "t.json: \"b\" is 4294967304, expected 0..2147483647");
    assert_int_equal(llm_json_int(j, "model_max_length", 0, INT64_MAX, &x, "t.json", err, sizeof err), -1);
    assert_non_null(strstr(err, "\"model_max_length\" is 1"));
    assert_int_equal(llm_json_int(j, "c", 0, 10, &x, "t.json", err, sizeof err), -1);
    assert_string_equal(err, "t.json: \"c\" must be an integer, found 1.5");
    assert_int_equal(llm_json_int(j, "d", 0, 10, &x, "t.json", err, sizeof err), -1);
    assert_string_equal(err, "t.json: \"d\" must be an integer, found a string");
    x = 99;
    assert_int_equal(llm_json_int(j, "e", 0, 10, &x, "t.json", err, sizeof err), 1);
    assert_int_equal(llm_json_int(j, "missing", 0, 10, &x, "t.json", err, sizeof err), 1);
    assert_int_equal(x, 99);
    assert_int_equal(llm_json_int(j, "f", -5, 0, &x, "t.json", err, sizeof err), 0);
    assert_int_equal(x, -3);
    json_decref(j);

    /* without such a key, integers stay exact: 2^63 - 1 is read as written */
    write_file(path, "{\"id\": 9223372036854775807}");
    j = llm_json_load(path, 0, true, err, sizeof err);
    assert_non_null(j);
    assert_int_equal(llm_json_int(j, "id", 0, INT64_MAX, &x, "t.json", err, sizeof err), 0);
    assert_true(x == INT64_MAX);
    json_decref(j);

    /* a real overflowing a double is still malformed, on one line */
    write_file(path, "{\"x\":\n 1e999}");
    assert_null(llm_json_load(path, 0, true, err, sizeof err));
    assert_non_null(strstr(err, "t.json: not valid JSON at line 2"));
    assert_null(strchr(err, '\n'));
    /* absent and optional: NULL, no message */
    snprintf(path, sizeof path, "%s/absent.json", dir);
    assert_null(llm_json_load(path, 0, false, err, sizeof err));
    assert_string_equal(err, "");
}

static void test_file_kinds(void **state)
{
    char *dir = *state, path[4096], err[512];
    size_t size;
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(llm_file_open(path, &size, err, sizeof err), -1); /* returns at once: no writer needed */
    assert_non_null(strstr(err, "fifo: is a FIFO (named pipe), expected a regular file"));
    remove(path);
    assert_int_equal(llm_file_open(dir, &size, err, sizeof err), -1);
    assert_non_null(strstr(err, "is a directory, expected a regular file"));
    assert_int_equal(llm_file_open("/dev/null", &size, err, sizeof err), -1);
    assert_string_equal(err, "/dev/null: is a device, expected a regular file");
    snprintf(path, sizeof path, "%s/nothing", dir);
    assert_int_equal(llm_file_open(path, &size, err, sizeof err), -1);
    assert_non_null(strstr(err, "nothing: cannot open: No such file or directory"));

    /* the cap is checked from the size, before anything is read */
    snprintf(path, sizeof path, "%s/big", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 1000), 0);
    close(fd);
    char *buf;
    size_t len;
    assert_int_equal(llm_file_read(path, 999, "test file", &buf, &len, err, sizeof err), -1);
    assert_non_null(strstr(err, "big: is 1000 bytes, more than the 999 a test file may hold"));
    assert_int_equal(llm_file_read(path, 1000, "test file", &buf, &len, err, sizeof err), 0);
    assert_int_equal(len, 1000);
    assert_int_equal(buf[1000], 0);
    free(buf);
    remove(path);

    /* a stream: read to the end, or refused one byte past the cap */
    assert_int_equal(llm_stream_read("/dev/zero", "/dev/zero", 100000, &buf, &len, err, sizeof err), -1);
    assert_string_equal(err, "/dev/zero: more than the 100000 bytes a prompt may hold");
    assert_int_equal(llm_stream_read("/dev/null", "/dev/null", 100000, &buf, &len, err, sizeof err), 0);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    free(buf);
    assert_int_equal(llm_stream_read(dir, "here", 100000, &buf, &len, err, sizeof err), -1);
    assert_string_equal(err, "here: is a directory, expected a text file");
}

static void test_available_memory(void **state)
{
    (void)state;
    size_t avail = llm_available_memory();
    assert_true(avail > 0);
}

static int setup(void **state)
{
    *state = stw_tmpdir();
    return 0;
}

static int teardown(void **state)
{
    stw_rmdir(*state);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_one_line),
        cmocka_unit_test_setup_teardown(test_json_int, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_kinds, setup, teardown),
        cmocka_unit_test(test_available_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
