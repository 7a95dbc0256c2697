/* The load's progress bar (progress.h): the drawing policy and the line's text, apart so that tests can drive both
 * with a fake clock. */
#include "progress.h"

#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "devices/host.h"

void llm_progress_init(llm_progress *p, FILE *out, double (*clock)(void))
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->clock = clock ? clock : llm_host_now_s;
    p->drawn_at = -1.0;
    p->columns = 80;
    struct winsize ws;
    if (out && ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) p->columns = ws.ws_col;
}

void llm_progress_start(llm_progress *p, const char *label, size_t total)
{
    llm_progress_finish(p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->start = p->clock();
    p->drawn_at = -1.0;
}

int llm_progress_format(char *buf, size_t n, const char *label, size_t done, size_t total, double elapsed)
{
    enum { BAR = 20 };
    if (n == 0) return 0;
    if (done > total) done = total;
    const double share = total ? (double)done / (double)total : 1.0;
    char bar[BAR + 1];
    const int full = (int)(share * BAR);
    for (int i = 0; i < BAR; i++) bar[i] = i < full ? '#' : ' ';
    bar[BAR] = '\0';
    const double unit = total >= 1000000000 ? 1e9 : 1e6;
    const char *unit_name = unit == 1e9 ? "GB" : "MB";
    char tail[128];
    int t = snprintf(tail, sizeof tail, " %3d%% [%s] %.2f/%.2f %s", (int)(share * 100.0), bar, (double)done / unit,
                     (double)total / unit, unit_name);
    if (elapsed > 0.0 && t > 0 && (size_t)t < sizeof tail)
        snprintf(tail + t, sizeof tail - (size_t)t, ", %.2f %s/s", (double)done / unit / elapsed, unit_name);
    /* a narrow line shortens the label first */
    const size_t room = n - 1, tail_len = strlen(tail), label_len = strlen(label);
    const size_t keep = tail_len >= room ? 0 : label_len < room - tail_len ? label_len : room - tail_len;
    snprintf(buf, n, "%.*s%s", (int)keep, label, tail);
    return (int)strlen(buf);
}

void llm_progress_update(llm_progress *p, size_t done)
{
    if (!p->out || !p->label[0]) return;
    const double now = p->clock();
    if (now - p->start < LLM_PROGRESS_DELAY_S) return;
    if (p->drawn_at >= 0.0 && now - p->drawn_at < LLM_PROGRESS_INTERVAL_S) return;
    char line[160]; /* within the terminal's width, less a column, so that the line never wraps */
    const size_t fits = p->columns < (int)sizeof line ? (size_t)p->columns : sizeof line;
    const int len = llm_progress_format(line, fits, p->label, done, p->total, now - p->start);
    /* over what the last draw left: the new text, then blanks as far as the old one reached */
    fprintf(p->out, "\r%s%*s", line, p->width > len ? p->width - len : 0, "");
    fflush(p->out);
    if (len > p->width) p->width = len;
    p->drawn_at = now;
}

void llm_progress_finish(llm_progress *p)
{
    if (p->out && p->width > 0) {
        fprintf(p->out, "\r%*s\r", p->width, "");
        fflush(p->out);
    }
    p->label[0] = '\0';
    p->width = 0;
    p->drawn_at = -1.0;
}

void llm_progress_callback(void *user, const char *what, size_t done, size_t total)
{
    llm_progress *p = user;
    if (strncmp(p->label, what, sizeof p->label - 1) != 0 || p->total != total || !p->label[0])
        llm_progress_start(p, what, total);
    if (done >= total)
        llm_progress_finish(p);
    else
        llm_progress_update(p, done);
}
