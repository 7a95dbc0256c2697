/* `llm-run devices [--measure]` (and `llm-run --list-devices`): every device llm-run knows, compiled in or not,
 * whether it is usable here and why not, what it is (describe()), its memory, and which ops it runs natively for
 * which weight dtypes; --measure adds each usable device's peak memory bandwidth; --plan MODEL loads the model on
 * each usable device (or the one --device names) and shows the plan its steps would run: which fusions each group
 * asks, which the device takes, and why it refuses the others (src/model/plan.c, the device's plan_group). Not
 * here: choosing a device (src/devices/registry.c) or the fallback itself (src/ops/runtime.c). */
#include <argtable2.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "devices/host.h"
#include "devices/registry.h"
#include "model/model.h"
#include "profile.h"

static double gib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

/* "embed rmsnorm matmul(F32 only) ..." and "-> cpu reference: ..." for the rest. */
static void print_ops(FILE *out, const llm_device *dev)
{
    const unsigned all = (1u << LLM_DTYPE_ELEMENT_COUNT) - 1, blocks = ((1u << LLM_DTYPE_COUNT) - 1) & ~all;
    char missing[256] = "";
    size_t used = 0;
    fprintf(out, "  native ops (F32, F16 and BF16 weights unless noted):");
    int n_native = 0;
    for (int op = 0; op < LLM_OP_COUNT; op++) {
        unsigned mask = 0;
        for (int d = 0; d < LLM_DTYPE_COUNT; d++)
            if (llm_ops_has(dev->ops, (llm_op)op) && dev->supports((llm_op)op, (llm_dtype)d)) mask |= 1u << d;
        if (mask == 0) {
            int w = snprintf(missing + used, sizeof missing - used, " %s", llm_op_name((llm_op)op));
            if (w > 0 && (size_t)w < sizeof missing - used) used += (size_t)w;
            continue;
        }
        n_native++;
        fprintf(out, " %s", llm_op_name((llm_op)op));
        if (op == LLM_OP_ATTENTION) { /* its dtype is the KV cache's (--cache-type) */
            fprintf(out, "(");
            for (int d = 0, first = 1; d < LLM_DTYPE_COUNT; d++)
                if (mask & 1u << d) fprintf(out, "%s%s", first ? "" : ",", llm_dtype_name((llm_dtype)d)), first = 0;
            fprintf(out, " KV cache)");
            continue;
        }
        if ((mask & all) != all) { /* differs by dtype: say for which */
            fprintf(out, "(");
            for (int d = 0, first = 1; d < LLM_DTYPE_ELEMENT_COUNT; d++)
                if (mask & 1u << d) fprintf(out, "%s%s", first ? "" : ",", llm_dtype_name((llm_dtype)d)), first = 0;
            fprintf(out, " weights)");
        }
        if (mask & blocks) { /* the quantized formats it multiplies natively (--quant) */
            fprintf(out, "(+");
            for (int d = LLM_DTYPE_ELEMENT_COUNT, first = 1; d < LLM_DTYPE_COUNT; d++)
                if (mask & 1u << d) fprintf(out, "%s%s", first ? "" : ",", llm_dtype_name((llm_dtype)d)), first = 0;
            fprintf(out, ")");
        }
    }
    fprintf(out, "%s\n", n_native ? "" : " none");
    if (used) fprintf(out, "  from the cpu reference:%s\n", missing);
}

int llm_cli_list_devices(FILE *out, bool measure, int threads)
{
    char err[256];
    if (threads && llm_cli_check_threads(threads, "-t", err, sizeof err)) {
        llm_cli_error(err); /* libgomp puts each thread's stack in memory: 100000 of them overflow it */
        return 1;
    }
    for (int i = 0; i < llm_device_known_count(); i++) {
        const llm_device *dev = NULL;
        const char *name = llm_device_known(i, &dev);
        if (!dev) {
            fprintf(out, "%-5s  not available: not compiled in\n", name);
            continue;
        }
        const char *kind = dev->kind == LLM_DEVICE_GPU ? "GPU" : "CPU";
        char why[256] = "";
        if (!dev->probe(why, sizeof why)) {
            fprintf(out, "%-5s  %s, not available: %s\n", name, kind, why);
            print_ops(out, dev);
            continue;
        }
        llm_device_options opt = {.threads = threads};
        char err[512] = "";
        if (dev->init(&opt, err, sizeof err) != 0) {
            fprintf(out, "%-5s  %s, not available: %s\n", name, kind, err);
            continue;
        }
        char desc[512] = "";
        dev->describe(desc, sizeof desc);
        fprintf(out, "%-5s  %s, available: %s\n", name, kind, desc);
        llm_device_memory mem = {0};
        dev->memory(&mem);
        fprintf(out, "  memory: %.1f GiB total, %.1f GiB free%s; %.1f MiB held by the device\n", gib(mem.total),
                gib(mem.free), dev->kind == LLM_DEVICE_CPU ? " (host RAM)" : "", gib(mem.allocated) * 1024.0);
        print_ops(out, dev);
        if (measure) {
            if (dev->measure_bandwidth)
                fprintf(out, "  peak bandwidth: %.1f GB/s (reading a large buffer, median of 5)\n",
                        dev->measure_bandwidth());
            else
                fprintf(out, "  peak bandwidth: this device cannot measure it\n");
        }
        fflush(out);
        dev->release();
        /* the machine's other GPUs, each opened in turn (the device is one GPU of a process at a time) */
        int count = dev->instances ? dev->instances() : 1;
        for (int k = 1; k < count; k++) {
            llm_device_options other = {.threads = threads, .index = k};
            if (dev->init(&other, err, sizeof err) != 0) {
                fprintf(out, "  %s:%d: not available: %s\n", name, k, err);
                continue;
            }
            dev->describe(desc, sizeof desc);
            fprintf(out, "  %s:%d: %s\n", name, k, desc);
            dev->release();
        }
        for (int a = 0; dev->link && a < count; a++)
            for (int b = a + 1; b < count; b++) {
                dev->link(a, b, desc, sizeof desc);
                fprintf(out, "  %s:%d <-> %s:%d: %s\n", name, a, name, b, desc);
            }
        if (count > 1 && dev->tp_unique_id)
            fprintf(out, "  %d GPUs: --tp %d (or --device %s:0,1,...) splits a model over them, a process each, "
                    "summed through peer memory or NCCL\n", count, count, name);
    }
    if (measure) {
        /* A decode step only reads weights: its ceiling is the read bandwidth, with one thread and with all. */
        int all = threads > 0 ? threads : llm_host_physical_cores();
        fprintf(out, "host memory: read bandwidth %.1f GB/s with 1 thread", llm_host_measure_read_bandwidth(1));
        if (all > 1) fprintf(out, ", %.1f GB/s with %d threads", llm_host_measure_read_bandwidth(all), all);
        fprintf(out, " (summing a large buffer, best of 5)\n");
    }
    return 0;
}

/* The plan of MODEL's steps on one device: loaded, a run state made (which plans), shown, freed. */
static int print_device_plan(FILE *out, const char *path, const char *device, int threads)
{
    llm_model m = {0};
    llm_state s;
    char err[512] = "";
    llm_load_options lo = {.device = device, .threads = threads, .log = stderr};
    if (llm_model_load(&m, path, &lo, err, sizeof err)) {
        llm_cli_error(err);
        return 1;
    }
    if (llm_state_init(&s, &m, 0, 0, false, err, sizeof err)) {
        llm_cli_error(err);
        llm_model_free(&m);
        return 1;
    }
    fprintf(out, "%s on %s: ", path, m.rt.dev->name);
    llm_profile_print_plan(&m, &s, out);
    fflush(out);
    llm_state_free(&s, &m);
    llm_model_free(&m);
    return 0;
}

/* --plan: on the device named, else on every device usable here. */
static int print_plans(FILE *out, const char *path, const char *device, int threads)
{
    if (device) return print_device_plan(out, path, device, threads);
    int rc = 0;
    for (int i = 0; i < llm_device_known_count(); i++) {
        const llm_device *dev = NULL;
        const char *name = llm_device_known(i, &dev);
        char why[256] = "";
        if (!dev || !dev->probe(why, sizeof why)) continue;
        if ((rc = print_device_plan(out, path, name, threads))) break; /* (the model's fault, said once) */
    }
    return rc;
}

int llm_cmd_devices(int argc, char **argv)
{
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    struct arg_lit *measure = arg_lit0(NULL, "measure", "also measure each available device's peak bandwidth");
    struct arg_int *threads = arg_int0("t", "threads", "N", "CPU threads for the CPU devices (default: physical cores)");
    struct arg_file *plan = arg_file0(NULL, "plan", "MODEL", "show the plan of MODEL's steps on each usable device");
    struct arg_str *device = arg_str0("d", "device", "NAME", "with --plan: this device only (cpu, blas, cuda, cuda:1)");
    struct arg_end *end = arg_end(8);
    void *table[] = {help, measure, threads, plan, device, end};
    int rc = 1;
    static const char usage[] =
        "usage: llm-run devices [--measure] [-t N] [--plan MODEL [-d DEVICE]]\n\n"
        "Lists every device llm-run knows: whether it is usable here (and why not), what it is, its memory,\n"
        "and which ops it runs natively (the others come from the cpu reference). With --plan, loads MODEL on\n"
        "each usable device and shows which fusions of its steps the device takes, and why it refuses others.\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run devices", usage, 26, &rc)) goto done;
    char err[256];
    if (threads->count && llm_cli_check_threads(threads->ival[0], "-t", err, sizeof err)) {
        llm_cli_error(err);
        goto done;
    }
    if (device->count && !plan->count) {
        llm_cli_error("devices: --device goes with --plan");
        goto done;
    }
    if (plan->count)
        rc = print_plans(stdout, plan->filename[0], device->count ? device->sval[0] : NULL,
                         threads->count ? threads->ival[0] : 0);
    else
        rc = llm_cli_list_devices(stdout, measure->count > 0, threads->count ? threads->ival[0] : 0);
done:
    arg_freetable(table, sizeof table / sizeof table[0]);
    return rc;
}
