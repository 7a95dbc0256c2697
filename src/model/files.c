/* Reading untrusted files and quoting them in messages (see files.h). */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Length of the well-formed UTF-8 sequence at s (overlongs, surrogates and values past U+10FFFF refused), 0 when
 * there is none. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) return 1;
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (!len || len > n || s[0] > 0xf4) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (s[0] == 0xe0 && s[1] < 0xa0) return 0; /* overlong */
    if (s[0] == 0xed && s[1] >= 0xa0) return 0; /* surrogate */
    if (s[0] == 0xf0 && s[1] < 0x90) return 0; /* overlong */
    if (s[0] == 0xf4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
    return len;
}

/* The escaped form of the character at s[0] in piece (up to 4 bytes + NUL); its length, and *step the bytes read. */
static size_t escape_one(const unsigned char *s, size_t n, char piece[8], size_t *step)
{
    *step = 1;
    if (s[0] == '\\' || s[0] == '"') return (size_t)snprintf(piece, 8, "\\%c", s[0]);
    if (s[0] == '\n') return (size_t)snprintf(piece, 8, "\\n");
    if (s[0] == '\t') return (size_t)snprintf(piece, 8, "\\t");
    if (s[0] == '\r') return (size_t)snprintf(piece, 8, "\\r");
    size_t len = s[0] < 0x20 || s[0] == 0x7f ? 0 : utf8_len(s, n);
    if (!len) return (size_t)snprintf(piece, 8, "\\x%02x", s[0]);
    memcpy(piece, s, len);
    *step = len;
    return len;
}

char *llm_escape(char *dst, size_t dst_len, const char *s, size_t n, size_t max)
{
    if (!dst_len) return dst;
    const unsigned char *u = (const unsigned char *)s;
    char piece[8];
    size_t step, total = 0, limit = max < dst_len - 1 ? max : dst_len - 1;
    for (size_t i = 0; i < n && total <= limit; i += step) total += escape_one(u + i, n - i, piece, &step);
    bool cut = total > limit;
    size_t room = cut ? (limit >= 3 ? limit - 3 : 0) : limit, k = 0;
    for (size_t i = 0; i < n; i += step) {
        size_t len = escape_one(u + i, n - i, piece, &step);
        if (k + len > room) break;
        memcpy(dst + k, piece, len);
        k += len;
    }
    if (cut && k + 3 <= dst_len - 1) memcpy(dst + k, "...", 3), k += 3;
    dst[k] = '\0';
    return dst;
}

void llm_message_one_line(char *msg)
{
    unsigned char *u = (unsigned char *)msg;
    size_t n = strlen(msg);
    for (size_t i = 0; i < n;) {
        size_t len = u[i] < 0x20 || u[i] == 0x7f ? 0 : utf8_len(u + i, n - i);
        if (!len) u[i++] = '?';
        else i += len;
    }
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode) ? "is a directory" : S_ISFIFO(mode) ? "is a FIFO (named pipe)"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "is a device" : S_ISSOCK(mode) ? "is a socket" : "is not a regular file";
}

int llm_file_open(const char *path, size_t *size, char *err, size_t err_len)
{
    /* O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        snprintf(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, err_len, "%s: %s, expected a regular file", path, file_kind(sb.st_mode));
        close(fd);
        return -1;
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > SIZE_MAX / 2) {
        snprintf(err, err_len, "%s: size %lld cannot be held in memory", path, (long long)sb.st_size);
        close(fd);
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *size = (size_t)sb.st_size;
    return fd;
}

/* Reads up to cap bytes from fd into buf; the count read, or -1 with errno. */
static ssize_t read_full(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        n += (size_t)r;
    }
    return (ssize_t)n;
}

int llm_file_read(const char *path, size_t max, const char *what, char **buf, size_t *len, char *err,
                  size_t err_len)
{
    *buf = NULL;
    *len = 0;
    size_t size;
    int fd = llm_file_open(path, &size, err, err_len);
    if (fd < 0) return -1;
    if (size > max) {
        snprintf(err, err_len, "%s: is %zu bytes, more than the %zu a %s may hold", path, size, max, what);
        close(fd);
        return -1;
    }
    char *b = malloc(size + 1);
    if (!b) {
        snprintf(err, err_len, "%s: out of memory for its %zu bytes", path, size);
        close(fd);
        return -1;
    }
    ssize_t got = read_full(fd, b, size);
    int e = errno;
    close(fd);
    if (got < 0) {
        snprintf(err, err_len, "%s: read error: %s", path, strerror(e));
        free(b);
        return -1;
    }
    b[got] = '\0';
    *buf = b;
    *len = (size_t)got;
    return 0;
}

int llm_stream_read(const char *path, const char *label, size_t max, char **buf, size_t *len, char *err,
                    size_t err_len)
{
    *buf = NULL;
    *len = 0;
    bool is_stdin = strcmp(path, "-") == 0;
    int fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", label, strerror(errno));
        return -1;
    }
    struct stat sb;
    int rc = -1;
    char *b = NULL;
    size_t n = 0, cap = 0;
    if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "%s: is a directory, expected a text file", label);
        goto done;
    }
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max) {
        snprintf(err, err_len, "%s: is %lld bytes, more than the %zu a prompt may hold", label,
                 (long long)sb.st_size, max);
        goto done;
    }
    for (;;) {
        if (n == cap) {
            /* one byte past max tells a stream that is too long from one that is exactly max */
            size_t want = cap ? (cap > max / 2 ? max + 1 : cap * 2) : 65536;
            if (want <= cap) {
                snprintf(err, err_len, "%s: more than the %zu bytes a prompt may hold", label, max);
                goto done;
            }
            char *bigger = realloc(b, want + 1);
            if (!bigger) {
                snprintf(err, err_len, "%s: out of memory after %zu bytes", label, n);
                goto done;
            }
            b = bigger, cap = want;
        }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, err_len, "%s: read error: %s", label, strerror(errno));
            goto done;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > max) {
        snprintf(err, err_len, "%s: more than the %zu bytes a prompt may hold", label, max);
        goto done;
    }
    if (!b && !(b = malloc(1))) {
        snprintf(err, err_len, "%s: out of memory", label);
        goto done;
    }
    b[n] = '\0';
    *buf = b, *len = n;
    b = NULL;
    rc = 0;
done:
    free(b);
    if (!is_stdin) close(fd);
    return rc;
}

json_t *llm_json_load(const char *path, int flags, bool required, char *err, size_t err_len)
{
    if (err_len) err[0] = '\0';
    struct stat sb;
    if (!required && lstat(path, &sb) != 0 && errno == ENOENT) return NULL;
    char *buf;
    size_t len;
    if (llm_file_read(path, LLM_JSON_MAX_BYTES, "JSON file", &buf, &len, err, err_len)) return NULL;
    json_error_t je;
    json_t *root = json_loadb(buf, len, (size_t)flags, &je);
    /* An integer past 64 bits: every integer a real instead, each checked where it is read (llm_json_int). */
    if (!root && json_error_code(&je) == json_error_numeric_overflow)
        root = json_loadb(buf, len, (size_t)flags | JSON_DECODE_INT_AS_REAL, &je);
    free(buf);
    if (!root) {
        snprintf(err, err_len, "%s: not valid JSON at line %d, column %d: %s", path, je.line, je.column, je.text);
        llm_message_one_line(err);
    }
    return root;
}

const char *llm_json_kind(const json_t *v)
{
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* v as an exact integer (a real only when it holds one in int64 range); false otherwise. */
static bool json_exact_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (!json_is_real(v)) return false;
    double d = json_real_value(v);
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

bool llm_json_int_value(const json_t *v, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t x;
    if (!json_exact_int(v, &x) || x < lo || x > hi) return false;
    *out = x;
    return true;
}

int llm_json_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *file,
                 char *err, size_t err_len)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 1;
    int64_t x;
    if (json_exact_int(v, &x)) {
        if (x >= lo && x <= hi) {
            *out = x;
            return 0;
        }
        snprintf(err, err_len, "%s: \"%s\" is %" PRId64 ", expected %" PRId64 "..%" PRId64, file, key, x, lo, hi);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        snprintf(err, err_len, "%s: \"%s\" is %.17g, expected %" PRId64 "..%" PRId64, file, key, json_real_value(v),
                 lo, hi);
    } else if (json_is_real(v)) {
        snprintf(err, err_len, "%s: \"%s\" must be an integer, found %.17g", file, key, json_real_value(v));
    } else {
        snprintf(err, err_len, "%s: \"%s\" must be an integer, found %s", file, key, llm_json_kind(v));
    }
    return -1;
}

/* A number from a one-line file such as cgroup's memory.max; false when absent or "max". */
static bool read_size_file(const char *path, size_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long v;
    bool ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (ok) *out = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
    return ok;
}

size_t llm_available_memory(void)
{
    size_t avail = SIZE_MAX;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = kb > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    if (avail == SIZE_MAX) {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) avail = (size_t)pages * (size_t)page;
    }
    /* A container's memory limit (cgroup v2) and this process's address-space limit bound it too. */
    size_t limit, used;
    if (read_size_file("/sys/fs/cgroup/memory.max", &limit) && read_size_file("/sys/fs/cgroup/memory.current", &used))
        avail = limit > used && limit - used < avail ? limit - used : limit > used ? avail : 1;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        size_t vm_pages = 0, page = (size_t)sysconf(_SC_PAGESIZE);
        FILE *statm = fopen("/proc/self/statm", "r");
        unsigned long long p;
        if (statm) {
            if (fscanf(statm, "%llu", &p) == 1) vm_pages = (size_t)p;
            fclose(statm);
        }
        size_t vm = vm_pages * page, cap = (size_t)rl.rlim_cur;
        size_t left = cap > vm ? cap - vm : 1;
        if (left < avail) avail = left;
    }
    return avail;
}
