/* Tensor parallelism's processes (tp.h): rank 0 starts and leads the workers; a worker runs what rank 0 sends.
 * The channel is one Unix socket a worker: rank 0 writes commands, the worker never writes, so the socket turning
 * readable on rank 0's side means the worker is gone (the watchdog thread's cue). */
#define _GNU_SOURCE
#include "tp.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "devices/registry.h"
#include "profile.h"

/* ---------- the device list ---------- */

int llm_tp_parse(const char *spec, char *name, size_t name_len, int *gpus, char *err, size_t err_len)
{
    const char *colon = spec ? strchr(spec, ':') : NULL;
    if (!colon || !strchr(colon, ',')) return 1;
    snprintf(name, name_len, "%.*s", (int)(colon - spec), spec);
    int n = 0;
    for (const char *p = colon + 1;; p++) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || k < 0 || k > 1024 || (*end && *end != ',')) {
            snprintf(err, err_len, "--device %s: expected %s:N,M,... with N, M device indices", spec, name);
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (gpus[i] == (int)k) {
                snprintf(err, err_len, "--device %s: GPU %ld is listed twice", spec, k);
                return -1;
            }
        if (n == LLM_TP_MAX) {
            snprintf(err, err_len, "--device %s: at most %d GPUs a model", spec, LLM_TP_MAX);
            return -1;
        }
        gpus[n++] = (int)k;
        if (!*end) break;
        p = end;
    }
    return n;
}

int llm_tp_device(const char *device, int tp, char *buf, size_t len, const char **out, char *err, size_t err_len)
{
    *out = device;
    if (tp < 0 || tp > LLM_TP_MAX) {
        snprintf(err, err_len, "--tp %d: expected 1 to %d GPUs", tp, LLM_TP_MAX);
        return -1;
    }
    if (tp <= 1) return 0;
    const char *d = device ? device : getenv("LLM_RUN_DEVICE");
    if (d && *d && strcmp(d, "auto") != 0 && strcmp(d, "cuda") != 0) {
        snprintf(err, err_len, "--tp %d with --device %s: --tp splits over cuda:0 .. cuda:%d (name other GPUs as "
                 "--device cuda:N,M,...)", tp, d, tp - 1);
        return -1;
    }
    int w = snprintf(buf, len, "cuda:0");
    for (int i = 1; i < tp && w > 0 && (size_t)w < len; i++) w += snprintf(buf + w, len - (size_t)w, ",%d", i);
    *out = buf;
    return 0;
}

/* ---------- messages: a header, then its payload ---------- */

enum { MSG_LOAD = 1, MSG_STATE_INIT, MSG_STATE_FREE, MSG_FORWARD, MSG_QUIT };

typedef struct {
    uint32_t type;
    uint32_t bytes; /* of the payload after the header */
    uint64_t id;    /* the run state (rank 0's pointer, only a name here) */
    int32_t a, b, c, d, e, f; /* LOAD: cache_type, cache_default, precision, threads, quant, quant_head; STATE_INIT:
                                 ctx, max_batch, all_logits; FORWARD: n, pos, op_by_op, profiled */
} msg;

/* Across hosts (--tp-listen, tp-worker --connect): what rank 0 tells a worker that connects, and its answer. Every
 * host runs the same build of llm-run (the messages are this build's structs). */
#define HELLO_MAGIC "llm-run"
#define HELLO_VERSION 2 /* raised whenever a message's layout changes */
typedef struct {
    char magic[8];
    uint32_t version;
    int32_t rank, size;
    unsigned char id[LLM_TP_ID_BYTES];
} hello;

typedef struct {
    char magic[8];
    uint32_t version;
    int32_t gpu; /* the worker's GPU, for rank 0's messages */
} hello_reply;

static int send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, len -= (size_t)w;
    }
    return 0;
}

/* 0 on a whole read, 1 at the end of the stream before any byte, -1 otherwise. */
static int recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = recv(fd, p + got, len - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0 && got == 0) return 1;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* ---------- rank 0: the leader ---------- */

typedef struct {
    llm_followers f; /* first: the model's hook points here */
    int n;           /* workers: ranks 1 .. n */
    int fd[LLM_TP_MAX];
    pid_t pid[LLM_TP_MAX];
    int gpu[LLM_TP_MAX];
    char peer[LLM_TP_MAX][64]; /* a connected worker's address (--tp-listen); its pid is 0 */
    char dev[32]; /* the device's name: "cuda" */
    pthread_t watchdog;
    bool watching;
    atomic_bool closing;
} leader;

/* Which worker (and how it ended) for the one line rank 0 says. */
static void say_gone(const leader *L, int i)
{
    int status = 0;
    pid_t w = waitpid(L->pid[i], &status, WNOHANG);
    char how[64] = "";
    if (w == L->pid[i] && WIFEXITED(status)) snprintf(how, sizeof how, " (exit %d)", WEXITSTATUS(status));
    if (w == L->pid[i] && WIFSIGNALED(status)) snprintf(how, sizeof how, " (signal %d)", WTERMSIG(status));
    if (L->pid[i] <= 0) /* connected over TCP: another host's process, or one started by hand */
        fprintf(stderr, "llm-run: tensor-parallel rank %d (%s:%d, connected from %s) stopped; stopping the group\n",
                i + 1, L->dev, L->gpu[i + 1], L->peer[i]);
    else
        fprintf(stderr, "llm-run: tensor-parallel rank %d (%s:%d, pid %d) stopped%s; stopping the group\n", i + 1,
                L->dev, L->gpu[i + 1], (int)L->pid[i], how);
}

/* A worker's socket turns readable only when the worker is gone. Rank 0 may then be waiting inside an all-reduce that
 * will never complete: it says which rank went and exits at once (the GPU's memory goes with the process). */
static void *watch(void *arg)
{
    leader *L = arg;
    struct pollfd p[LLM_TP_MAX];
    for (int i = 0; i < L->n; i++) p[i] = (struct pollfd){.fd = L->fd[i], .events = POLLIN};
    for (;;) {
        int r = poll(p, (nfds_t)L->n, 200);
        if (atomic_load(&L->closing)) return NULL;
        if (r < 0 && errno == EINTR) continue;
        for (int i = 0; r > 0 && i < L->n; i++)
            if (p[i].revents) {
                usleep(100 * 1000); /* its exit status, and a closing that raced with it */
                if (atomic_load(&L->closing)) return NULL;
                say_gone(L, i);
                _exit(1);
            }
    }
}

/* Every worker told to stop, given a few seconds (one waiting in an all-reduce rank 0 left never reads it), then
 * killed. */
static void stop_workers(leader *L)
{
    atomic_store(&L->closing, true);
    msg q = {.type = MSG_QUIT};
    for (int i = 0; i < L->n; i++)
        if (L->fd[i] >= 0) send_all(L->fd[i], &q, sizeof q);
    if (L->watching) pthread_join(L->watchdog, NULL);
    L->watching = false;
    for (int i = 0; i < L->n; i++) {
        if (L->pid[i] <= 0) continue;
        int status, tries = 0;
        while (waitpid(L->pid[i], &status, WNOHANG) == 0) {
            if (++tries == 100) { /* 5 s */
                kill(L->pid[i], SIGKILL);
                waitpid(L->pid[i], &status, 0);
                break;
            }
            usleep(50 * 1000);
        }
        L->pid[i] = 0;
    }
    for (int i = 0; i < L->n; i++)
        if (L->fd[i] >= 0) close(L->fd[i]), L->fd[i] = -1;
}

static int broadcast(leader *L, const msg *h, const void *payload, char *err, size_t err_len)
{
    for (int i = 0; i < L->n; i++)
        if (send_all(L->fd[i], h, sizeof *h) || (h->bytes && send_all(L->fd[i], payload, h->bytes))) {
            snprintf(err, err_len, "tensor-parallel rank %d (%s:%d) is gone", i + 1, L->dev, L->gpu[i + 1]);
            return -1;
        }
    return 0;
}

static int lead_state_init(llm_followers *f, const void *id, int ctx, int max_batch, bool all_logits, char *err,
                           size_t err_len)
{
    msg h = {.type = MSG_STATE_INIT, .id = (uint64_t)(uintptr_t)id, .a = ctx, .b = max_batch, .c = all_logits};
    return broadcast((leader *)f, &h, NULL, err, err_len);
}

static void lead_state_free(llm_followers *f, const void *id)
{
    char err[128];
    msg h = {.type = MSG_STATE_FREE, .id = (uint64_t)(uintptr_t)id};
    broadcast((leader *)f, &h, NULL, err, sizeof err); /* a worker gone is the watchdog's to say */
}

static int lead_forward(llm_followers *f, const void *id, const int32_t *tokens, int n, int pos, bool op_by_op,
                        int profiled, char *err, size_t err_len)
{
    msg h = {.type = MSG_FORWARD, .bytes = (uint32_t)((size_t)n * sizeof *tokens), .id = (uint64_t)(uintptr_t)id,
             .a = n, .b = pos, .c = op_by_op, .d = profiled};
    return broadcast((leader *)f, &h, tokens, err, err_len);
}

static void lead_close(llm_followers *f)
{
    leader *L = (leader *)f;
    stop_workers(L);
    free(L);
}

/* Worker i (rank i + 1) started: this binary as `tp-worker`, its rank and its end of the socket in the environment.
 * Everything the child needs is made before the fork (the parent has threads: NCCL's), so that the child only execs. */
static int spawn(leader *L, int i, const char *exe, const char *dev_name, const unsigned char *id, char *err,
                 size_t err_len)
{
    extern char **environ;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, err_len, "tensor parallelism: socketpair: %s", strerror(errno));
        return -1;
    }
    int fd = dup(sv[1]); /* the worker's end, without close-on-exec: only this child inherits it */
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = calloc(n_env + 6, sizeof *envp);
    char vars[5][2 * LLM_TP_ID_BYTES + 32];
    if (fd < 0 || !envp) {
        if (fd >= 0) close(fd);
        close(sv[0]), close(sv[1]), free(envp);
        snprintf(err, err_len, "tensor parallelism: out of file descriptors or memory");
        return -1;
    }
    int v = snprintf(vars[0], sizeof vars[0], "LLM_TP_ID=");
    for (int k = 0; k < LLM_TP_ID_BYTES; k++) v += snprintf(vars[0] + v, sizeof vars[0] - (size_t)v, "%02x", id[k]);
    snprintf(vars[1], sizeof vars[1], "LLM_TP_RANK=%d", i + 1);
    snprintf(vars[2], sizeof vars[2], "LLM_TP_SIZE=%d", L->n + 1);
    snprintf(vars[3], sizeof vars[3], "LLM_TP_FD=%d", fd);
    snprintf(vars[4], sizeof vars[4], "LLM_TP_DEVICE=%s:%d", dev_name, L->gpu[i + 1]);
    for (int k = 0; k < 5; k++) envp[k] = vars[k]; /* first: getenv finds these before any inherited ones */
    for (size_t k = 0; k < n_env; k++) envp[5 + k] = environ[k];
    char *const args[] = {(char *)exe, "tp-worker", NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) { /* the child: async-signal-safe calls only, then exec */
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* rank 0 gone: so is this rank, whatever it waits on */
        if (getppid() != parent) _exit(1);
        execve(exe, args, envp);
        static const char failed[] = "llm-run: tensor parallelism: cannot start a worker (exec failed)\n";
        if (write(2, failed, sizeof failed - 1) < 0) _exit(127);
        _exit(127);
    }
    int fork_errno = errno;
    close(fd), close(sv[1]), free(envp);
    if (pid < 0) {
        close(sv[0]);
        snprintf(err, err_len, "tensor parallelism: fork: %s", strerror(fork_errno));
        return -1;
    }
    L->fd[i] = sv[0], L->pid[i] = pid;
    return 0;
}

/* "[HOST:]PORT" into host (empty: any) and port. 0, else err. */
static int split_address(const char *where, const char *flag, char *host, size_t host_len, char *port, size_t port_len,
                         char *err, size_t err_len)
{
    const char *colon = strrchr(where, ':');
    const char *p = colon ? colon + 1 : where;
    char *end;
    long v = strtol(p, &end, 10);
    if (!*p || *end || v < 0 || v > 65535 || (colon && (size_t)(colon - where) >= host_len)) {
        snprintf(err, err_len, "%s %s: expected [HOST:]PORT with PORT 0 to 65535", flag, where);
        return -1;
    }
    snprintf(host, host_len, "%.*s", colon ? (int)(colon - where) : 0, where);
    snprintf(port, port_len, "%ld", v);
    return 0;
}

static void no_delay(int fd)
{
    int one = 1; /* each forward call is one small message: sent now, not gathered (Nagle) */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0 across hosts: listen at `where` and take L->n workers as they connect, ranks in order of arrival; each is
 * told its rank, the group's size and NCCL's id, and answers with its GPU. Waits at most ten minutes. */
static int accept_workers(leader *L, const char *where, const unsigned char *id, char *err, size_t err_len)
{
    char host[256], port[16];
    if (split_address(where, "--tp-listen", host, sizeof host, port, sizeof port, err, err_len)) return -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int rc = getaddrinfo(*host ? host : NULL, port, &hints, &ai), lfd = -1;
    if (rc != 0) {
        snprintf(err, err_len, "--tp-listen %s: %s", where, gai_strerror(rc));
        return -1;
    }
    int e = 0;
    for (struct addrinfo *a = ai; a && lfd < 0; a = a->ai_next) {
        int one = 1;
        lfd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (lfd < 0) continue;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(lfd, a->ai_addr, a->ai_addrlen) != 0 || listen(lfd, LLM_TP_MAX) != 0) e = errno, close(lfd), lfd = -1;
    }
    freeaddrinfo(ai);
    if (lfd < 0) {
        snprintf(err, err_len, "--tp-listen %s: cannot listen there: %s", where, strerror(e ? e : EADDRNOTAVAIL));
        return -1;
    }
    fprintf(stderr, "llm-run: tensor parallelism: rank 0 on %s:%d, waiting on port %s for %d more rank%s: start "
            "each as  llm-run tp-worker --connect THIS_HOST:%s --device cuda:N\n", L->dev, L->gpu[0], port, L->n,
            L->n == 1 ? "" : "s", port);
    for (int i = 0; i < L->n; i++) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int r;
        do r = poll(&p, 1, 600 * 1000);
        while (r < 0 && errno == EINTR);
        if (r <= 0) {
            snprintf(err, err_len, "--tp-listen %s: %d of %d ranks joined in ten minutes", where, i + 1, L->n + 1);
            close(lfd);
            return -1;
        }
        struct sockaddr_storage from;
        socklen_t from_len = sizeof from;
        int fd = accept4(lfd, (struct sockaddr *)&from, &from_len, SOCK_CLOEXEC);
        if (fd < 0) {
            i--; /* a connection that went before it was taken */
            continue;
        }
        no_delay(fd);
        char h[64] = "?", sv[16] = "";
        getnameinfo((struct sockaddr *)&from, from_len, h, sizeof h, sv, sizeof sv, NI_NUMERICHOST | NI_NUMERICSERV);
        hello hi = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .rank = i + 1, .size = L->n + 1};
        memcpy(hi.id, id, LLM_TP_ID_BYTES);
        hello_reply back;
        struct timeval t = {.tv_sec = 30}; /* a stranger that says nothing does not hold the group */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
        if (send_all(fd, &hi, sizeof hi) || recv_all(fd, &back, sizeof back) ||
            memcmp(back.magic, HELLO_MAGIC, sizeof back.magic) || back.version != HELLO_VERSION || back.gpu < 0) {
            fprintf(stderr, "llm-run: tensor parallelism: %s is not an llm-run tp-worker of this version; ignored\n", h);
            close(fd);
            i--;
            continue;
        }
        t.tv_sec = 0;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
        L->fd[i] = fd, L->pid[i] = 0, L->gpu[i + 1] = back.gpu;
        snprintf(L->peer[i], sizeof L->peer[i], "%s", h);
        fprintf(stderr, "llm-run: tensor parallelism: rank %d is %s:%d at %s\n", i + 1, L->dev, back.gpu, h);
    }
    close(lfd);
    return 0;
}

int llm_tp_load(llm_model *m, const char *path, const llm_load_options *lo, char *err, size_t err_len)
{
    char name[32];
    int gpus[LLM_TP_MAX];
    int n = llm_tp_parse(lo ? lo->device : NULL, name, sizeof name, gpus, err, err_len);
    if (n < 0) return -1;
    if (n < 2 && lo && lo->tp_listen) {
        snprintf(err, err_len, "--tp-listen %s: give the group's size too (--tp N, or --device cuda:0,1,...)",
                 lo->tp_listen);
        return -1;
    }
    if (n < 2) return llm_model_load(m, path, lo, err, err_len);
    memset(m, 0, sizeof *m);
    const llm_device *dev = llm_device_find(name);
    char why[256] = "";
    if (!dev || !dev->tp_unique_id) {
        snprintf(err, err_len, "--device %s: %s", lo->device,
                 dev ? "this device cannot split a model over several (tensor parallelism: cuda with NCCL)"
                     : "unknown or not built in");
        return -1;
    }
    if (!dev->probe(why, sizeof why)) {
        snprintf(err, err_len, "--device %s: not usable here: %s", lo->device, why);
        return -1;
    }
    unsigned char id[LLM_TP_ID_BYTES];
    if (dev->tp_unique_id(id, err, err_len)) return -1;
    char exe[4096];
    const char *given = getenv("LLM_TP_EXE");
    if (given && *given) {
        snprintf(exe, sizeof exe, "%s", given);
    } else {
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len <= 0) {
            snprintf(err, err_len, "tensor parallelism: cannot find this program (/proc/self/exe): %s",
                     strerror(errno));
            return -1;
        }
        exe[len] = '\0';
    }
    leader *L = calloc(1, sizeof *L);
    if (!L) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    L->f = (llm_followers){lead_state_init, lead_state_free, lead_forward, lead_close};
    L->n = n - 1;
    memcpy(L->gpu, gpus, sizeof gpus);
    snprintf(L->dev, sizeof L->dev, "%s", name);
    for (int i = 0; i < L->n; i++) L->fd[i] = -1;
    fflush(NULL); /* nothing buffered twice */
    if (lo->tp_listen) {
        if (accept_workers(L, lo->tp_listen, id, err, err_len)) goto fail;
    } else {
        for (int i = 0; i < L->n; i++)
            if (spawn(L, i, exe, name, id, err, err_len)) goto fail;
    }
    /* what every rank loads as rank 0 does: the path, then the options that shape the weights and the cache */
    msg h = {.type = MSG_LOAD, .bytes = (uint32_t)strlen(path) + 1, .a = (int32_t)lo->cache_type,
             .b = lo->cache_default, .c = (int32_t)lo->precision, .d = lo->threads, .e = (int32_t)lo->quant,
             .f = lo->quant_head};
    if (broadcast(L, &h, path, err, err_len)) goto fail;
    if (pthread_create(&L->watchdog, NULL, watch, L) != 0) {
        snprintf(err, err_len, "tensor parallelism: cannot start the watchdog thread");
        goto fail;
    }
    L->watching = true;
    llm_load_options mine = *lo;
    char dev0[48];
    snprintf(dev0, sizeof dev0, "%s:%d", name, gpus[0]);
    mine.device = dev0;
    mine.tp.rank = 0, mine.tp.size = n;
    memcpy(mine.tp.id, id, sizeof id);
    if (llm_model_load(m, path, &mine, err, err_len)) goto fail;
    m->followers = &L->f;
    return 0;

fail:
    stop_workers(L);
    free(L);
    return -1;
}

/* ---------- a worker ---------- */

/* A trace hook that looks at nothing: with it llm_forward issues each op on its own, as rank 0's does under a
 * profile or a compare. */
static void issue_op_by_op(void *user, const char *what, int layer, const float *buf, size_t count)
{
    (void)user, (void)what, (void)layer, (void)buf, (void)count;
}

#define WORKER_STATES 8

static int env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    char *end;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || x < 0 || x > 1 << 20) return -1;
    *out = (int)x;
    return 0;
}

/* A worker started by rank 0 on this host: its place in the environment (spawn). 0, else -1. */
static int worker_from_env(int *rank, int *size, int *fd, llm_load_options *lo)
{
    const char *hex = getenv("LLM_TP_ID");
    lo->device = getenv("LLM_TP_DEVICE");
    if (env_int("LLM_TP_RANK", rank) || env_int("LLM_TP_SIZE", size) || env_int("LLM_TP_FD", fd) || !lo->device ||
        !hex || strlen(hex) != 2 * LLM_TP_ID_BYTES || *rank < 1 || *rank >= *size)
        return -1;
    for (int k = 0; k < LLM_TP_ID_BYTES; k++) {
        unsigned v;
        if (sscanf(hex + 2 * k, "%2x", &v) != 1) return -1;
        lo->tp.id[k] = (unsigned char)v;
    }
    return 0;
}

/* A worker started by hand or by mpirun (`--connect HOST:PORT`): connects to rank 0, retrying for two minutes (the
 * ranks may start in any order), and learns its place from rank 0's hello. 0, else err. */
static int worker_connect(const char *where, const char *device, int *rank, int *size, int *fd, llm_load_options *lo,
                          char *dev_buf, size_t dev_len, char *err, size_t err_len)
{
    char host[256], port[16];
    if (split_address(where, "--connect", host, sizeof host, port, sizeof port, err, err_len)) return -1;
    int gpu = 0;
    if (device) {
        const char *colon = strchr(device, ':');
        char *end;
        long k = colon ? strtol(colon + 1, &end, 10) : 0;
        if (colon && (end == colon + 1 || *end || k < 0 || k > 1024)) {
            snprintf(err, err_len, "--device %s: expected cuda or cuda:N", device);
            return -1;
        }
        gpu = (int)k;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int s = -1, rc = 0, e = 0;
    for (int tries = 0; s < 0 && tries < 240; tries++) {
        if (tries) usleep(500 * 1000);
        if ((rc = getaddrinfo(*host ? host : "localhost", port, &hints, &ai)) != 0) {
            if (rc == EAI_AGAIN) continue;
            snprintf(err, err_len, "--connect %s: %s", where, gai_strerror(rc));
            return -1;
        }
        for (struct addrinfo *a = ai; a && s < 0; a = a->ai_next) {
            s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (s >= 0 && connect(s, a->ai_addr, a->ai_addrlen) != 0) e = errno, close(s), s = -1;
        }
        freeaddrinfo(ai);
    }
    if (s < 0) {
        snprintf(err, err_len, "--connect %s: no rank 0 there in two minutes (%s)", where, strerror(e ? e : ETIMEDOUT));
        return -1;
    }
    no_delay(s);
    hello hi;
    hello_reply back = {.magic = HELLO_MAGIC, .version = HELLO_VERSION, .gpu = gpu};
    if (recv_all(s, &hi, sizeof hi) || memcmp(hi.magic, HELLO_MAGIC, sizeof hi.magic) ||
        hi.version != HELLO_VERSION || hi.size < 2 || hi.size > LLM_TP_MAX || hi.rank < 1 || hi.rank >= hi.size ||
        send_all(s, &back, sizeof back)) {
        snprintf(err, err_len, "--connect %s: no llm-run rank 0 of this version answered there", where);
        close(s);
        return -1;
    }
    *rank = hi.rank, *size = hi.size, *fd = s;
    memcpy(lo->tp.id, hi.id, LLM_TP_ID_BYTES);
    snprintf(dev_buf, dev_len, "cuda:%d", gpu);
    lo->device = dev_buf;
    return 0;
}

int llm_cmd_tp_worker(int argc, char **argv)
{
    int rank, size, fd;
    llm_load_options lo = {0};
    char err[1024], path[4096], dev[32];
    if (argc >= 3 && strcmp(argv[1], "--connect") == 0) {
        const char *device = argc >= 5 && strcmp(argv[3], "--device") == 0 ? argv[4] : NULL;
        if ((argc != 3 && !device) || argc > 5) {
            fprintf(stderr, "usage: llm-run tp-worker --connect HOST:PORT [--device cuda:N]\n");
            return 1;
        }
        if (worker_connect(argv[2], device, &rank, &size, &fd, &lo, dev, sizeof dev, err, sizeof err)) {
            fprintf(stderr, "llm-run: tp-worker: %s\n", err);
            return 1;
        }
        fprintf(stderr, "llm-run: tensor parallelism: rank %d of %d on %s\n", rank, size, lo.device);
    } else if (argc > 1 || worker_from_env(&rank, &size, &fd, &lo)) {
        fprintf(stderr, "llm-run tp-worker: a rank of a model split over GPUs (tensor parallelism). Started by llm-run "
                "itself on this host (--tp N), or by hand or mpirun on any host as\n"
                "  llm-run tp-worker --connect HOST:PORT [--device cuda:N]\n"
                "to join the rank 0 that runs  llm-run MODEL --tp N --tp-listen PORT  on HOST\n");
        return 1;
    }
    lo.tp.rank = rank, lo.tp.size = size;
    msg h;
    if (recv_all(fd, &h, sizeof h) || h.type != MSG_LOAD || h.bytes == 0 || h.bytes > sizeof path ||
        recv_all(fd, path, h.bytes) || path[h.bytes - 1]) {
        fprintf(stderr, "llm-run: tensor-parallel rank %d: no model from rank 0\n", rank);
        return 1;
    }
    lo.cache_type = (llm_dtype)h.a, lo.cache_default = h.b, lo.precision = (llm_precision)h.c, lo.threads = h.d;
    lo.quant = (llm_dtype)h.e, lo.quant_head = h.f;
    llm_model m;
    if (llm_model_load(&m, path, &lo, err, sizeof err)) {
        fprintf(stderr, "llm-run: tensor-parallel rank %d: %s\n", rank, err);
        return 1;
    }
    struct {
        uint64_t id;
        llm_state s;
        bool used;
    } st[WORKER_STATES] = {0};
    int32_t *tokens = NULL;
    llm_profile *prof = NULL; /* while rank 0 profiles */
    int rc = 0;
    for (;;) {
        int r = recv_all(fd, &h, sizeof h);
        if (r == 1 || (r == 0 && h.type == MSG_QUIT)) break; /* rank 0 done (or gone) */
        if (r) {
            snprintf(err, sizeof err, "the message from rank 0 broke off");
            goto fail;
        }
        int slot = -1;
        for (int i = 0; i < WORKER_STATES; i++)
            if (st[i].used && st[i].id == h.id) slot = i;
        if (h.type == MSG_STATE_INIT) {
            for (int i = 0; i < WORKER_STATES && slot < 0; i++)
                if (!st[i].used) slot = i;
            if (slot < 0 || st[slot].used) {
                snprintf(err, sizeof err, "more than %d run states at once", WORKER_STATES);
                goto fail;
            }
            if (llm_state_init(&st[slot].s, &m, h.a, h.b, h.c != 0, err, sizeof err)) goto fail;
            st[slot].id = h.id, st[slot].used = true;
        } else if (h.type == MSG_STATE_FREE) {
            if (slot >= 0) llm_state_free(&st[slot].s, &m), st[slot].used = false;
        } else if (h.type == MSG_FORWARD) {
            free(tokens);
            tokens = malloc(h.bytes ? h.bytes : 1);
            const float *logits;
            const bool phase_ok = h.d >= 0 && h.d <= LLM_PROFILE_N_PHASES; /* 0: not profiled */
            if (!tokens || slot < 0 || !phase_ok || h.a < 1 || h.bytes != (uint32_t)h.a * sizeof *tokens ||
                recv_all(fd, tokens, h.bytes)) {
                snprintf(err, sizeof err, "a forward call from rank 0 %s",
                         slot < 0 ? "names no run state" : !phase_ok ? "names no profile phase" : "broke off");
                goto fail;
            }
            if (h.d && !prof) { /* rank 0 profiles: so does this rank, op by op as rank 0 (the profile's trace) */
                m.trace = NULL;
                if (!(prof = llm_profile_start(&m, err, sizeof err))) goto fail;
            } else if (!prof) {
                m.trace = h.c ? issue_op_by_op : NULL; /* as rank 0 issues this call (llm_followers) */
            }
            llm_profile *timed = h.d ? prof : NULL; /* as the phase rank 0 times it */
            llm_profile_step_begin(timed, (llm_profile_phase)(h.d - 1), h.b, h.a);
            if (llm_forward(&m, &st[slot].s, tokens, h.a, h.b, &logits, err, sizeof err)) goto fail;
            llm_profile_step_end(timed);
        } else {
            snprintf(err, sizeof err, "unknown message %u from rank 0", h.type);
            goto fail;
        }
    }
    goto done;
fail:
    fprintf(stderr, "llm-run: tensor-parallel rank %d: %s\n", rank, err);
    rc = 1;
done:
    if (prof) {
        char who[96];
        snprintf(who, sizeof who, "llm-run: profile of tensor-parallel rank %d (%s)", rank,
                 lo.device ? lo.device : m.rt.dev->name);
        llm_profile_print_brief(prof, who, stderr);
        llm_profile_stop(prof);
    }
    for (int i = 0; i < WORKER_STATES; i++)
        if (st[i].used) llm_state_free(&st[i].s, &m);
    free(tokens);
    llm_model_free(&m);
    close(fd);
    return rc;
}
