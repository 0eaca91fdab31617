/* Timelines: Chrome-trace JSON written, and drawn as SVG. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/read_file.h"
#include "core/check.h"
#include "schedule/timeline.h"
#include "schedule/verify.h"

static const char *category(int kind) {
  switch (kind) {
  case LOOM_ACT_FORWARD: return "forward";
  case LOOM_ACT_BACKWARD:
  case LOOM_ACT_BACKWARD_INPUT: return "backward";
  case LOOM_ACT_BACKWARD_WEIGHT: return "weight";
  case LOOM_ACT_SEND_ACT:
  case LOOM_ACT_SEND_GRAD: return "send";
  case LOOM_ACT_RECV_ACT:
  case LOOM_ACT_RECV_GRAD: return "recv";
  default: return "reduce";
  }
}

/* "F3", "B3b", "W3b", "recv act 3", "optimizer step" (a split backward's halves are B and W) */
static void span_name(char *out, size_t n, int kind, int mb, int chunk, int chunks) {
  const char suffix[2] = {chunks > 1 && chunk >= 0 ? (char)('a' + chunk) : '\0', '\0'};
  switch (kind) {
  case LOOM_ACT_FORWARD: snprintf(out, n, "F%d%s", mb, suffix); break;
  case LOOM_ACT_BACKWARD:
  case LOOM_ACT_BACKWARD_INPUT: snprintf(out, n, "B%d%s", mb, suffix); break;
  case LOOM_ACT_BACKWARD_WEIGHT: snprintf(out, n, "W%d%s", mb, suffix); break;
  case LOOM_ACT_SEND_ACT: snprintf(out, n, "send act %d%s", mb, suffix); break;
  case LOOM_ACT_SEND_GRAD: snprintf(out, n, "send grad %d%s", mb, suffix); break;
  case LOOM_ACT_RECV_ACT: snprintf(out, n, "recv act %d%s", mb, suffix); break;
  case LOOM_ACT_RECV_GRAD: snprintf(out, n, "recv grad %d%s", mb, suffix); break;
  default: snprintf(out, n, "%s", loom_action_name((loom_action_kind)kind)); break;
  }
}

static void write_span(FILE *fp, int *first, const char *name, const char *cat, double ts, double dur, int tid) {
  fprintf(fp, "%s\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 0, \"tid\": %d}",
          *first ? "" : ",", name, cat, ts, dur, tid);
  *first = 0;
}

/* A rank's buffers by its schedule's events, counted along its spans (in
 * action order: a span's action and every one before it that left no span). */
typedef struct {
  const loom_schedule *sched; /* NULL: not counted */
  int rank, next;             /* the schedule's rank; its next action to count */
  int held[LOOM_BUFFER_KINDS], shown[LOOM_BUFFER_KINDS];
} buffer_count;

static void write_count(FILE *fp, int *first, buffer_count *c, double ts, int tid) {
  if (memcmp(c->held, c->shown, sizeof c->held) == 0) return;
  memcpy(c->shown, c->held, sizeof c->held);
  fprintf(fp, "%s\n{\"name\": \"buffers, rank %d\", \"ph\": \"C\", \"ts\": %.3f, \"pid\": 0, \"tid\": %d, "
              "\"args\": {\"slots\": %d, \"weight_states\": %d, \"sends\": %d}}",
          *first ? "" : ",", tid, ts, tid, c->held[LOOM_BUFFER_SLOT], c->held[LOOM_BUFFER_WSTATE], c->held[LOOM_BUFFER_SEND]);
  *first = 0;
}

/* At a rank's first span: nothing held at the step's start. */
static void count_buffers_from(buffer_count *c, FILE *fp, int *first, const loom_schedule *s, const loom_trace_span *e) {
  *c = (buffer_count){.sched = s && e->stage_rank >= 0 && e->stage_rank < s->p ? s : NULL, .rank = e->stage_rank,
                      .shown = {-1, -1, -1}}; /* nothing shown yet: the zeros are written */
  if (c->sched) write_count(fp, first, c, 0.0, e->rank);
}

/* One action at ts: what it holds while it runs, then what it gives back. */
static void count_action(buffer_count *c, FILE *fp, int *first, double ts, int tid) {
  loom_schedule_hold(c->sched, c->rank, c->next, true, c->held);
  write_count(fp, first, c, ts, tid);
  loom_schedule_hold(c->sched, c->rank, c->next++, false, c->held);
}

/* Through span e: the actions before it that left no span (instants, at
 * its start), then its own (held from its start, given back at its end); at
 * the rank's last span, every action left. Spans out of action order stop
 * the count. */
static void count_buffers_to(buffer_count *c, FILE *fp, int *first, const loom_trace_span *e, bool last_of_rank) {
  if (!c->sched) return;
  const int count = c->sched->count[c->rank];
  if (e->action < c->next || e->action >= count) {
    c->sched = NULL;
    return;
  }
  while (c->next < e->action) count_action(c, fp, first, e->start_us, e->rank);
  count_action(c, fp, first, e->start_us, e->rank);
  write_count(fp, first, c, e->end_us, e->rank);
  while (last_of_rank && c->next < count) count_action(c, fp, first, e->end_us, e->rank);
  write_count(fp, first, c, e->end_us, e->rank);
}

loom_status loom_trace_write_json(const char *path, const loom_trace_span *spans, int n, const loom_trace_info *info,
                                  loom_error *err) {
  FILE *fp = fopen(path, "w");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "--trace %s: cannot open for writing: %s", path, strerror(errno));
  double makespan = 0.0;
  for (int i = 0; i < n; i++) makespan = fmax(makespan, spans[i].end_us);
  int first = 1;
  buffer_count count = {0};
  fprintf(fp, "{\"traceEvents\": [");
  for (int i = 0; i < n; i++) {
    const loom_trace_span *e = &spans[i];
    if (i == 0 || spans[i - 1].rank != e->rank) count_buffers_from(&count, fp, &first, info->sched, e);
    const double cursor = i > 0 && spans[i - 1].rank == e->rank ? spans[i - 1].end_us : 0.0;
    if (e->start_us > cursor + 20.0) /* gaps under 20 us are bookkeeping, not idle */
      write_span(fp, &first, "idle", "idle", cursor, e->start_us - cursor, e->rank);
    char name[64];
    span_name(name, sizeof name, e->kind, e->mb, e->chunk, info->vpp);
    write_span(fp, &first, name, category(e->kind), e->start_us, e->end_us - e->start_us, e->rank);
    const bool last_of_rank = i + 1 == n || spans[i + 1].rank != e->rank;
    count_buffers_to(&count, fp, &first, e, last_of_rank);
    if (last_of_rank && makespan > e->end_us + 0.5) write_span(fp, &first, "idle", "idle", e->end_us, makespan - e->end_us, e->rank);
  }
  if (info->nring) /* the ring's spans: a process of their own, a row per rank */
    fprintf(fp, ",\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"context-parallel ring\"}}");
  for (int i = 0; i < info->nring; i++) {
    const loom_trace_span *e = &info->ring[i];
    fprintf(fp, ",\n{\"name\": \"%s\", \"cat\": \"ring\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 1, \"tid\": %d}",
            LOOM_RING_SPAN_NAMES[e->kind], e->start_us, e->end_us - e->start_us, e->rank);
  }
  fprintf(fp, "\n],\n\"displayTimeUnit\": \"ms\",\n\"loom\": {\"ranks\": %d, \"pp\": %d, \"vpp\": %d, "
              "\"micro_batches\": %d, \"schedule\": \"%s\", \"%s\": %.4f, \"bubble_theory\": %.4f}}\n",
          info->ranks, info->pp, info->vpp, info->m, info->schedule, info->bubble_label, info->bubble, info->theory);
  if (fclose(fp) != 0) return loom_fail(err, LOOM_ERR_WRITE, "--trace %s: write failed", path);
  return LOOM_OK;
}

typedef struct {
  char name[64], cat[16];
  double ts, dur;
  int tid;
} span;

/* A rank's buffer counter from ts on (slots + weight-grad states + sends). */
typedef struct {
  double ts;
  int tid, held;
} level;

static const char *fill_of(const char *cat) {
  if (strcmp(cat, "forward") == 0) return "#4C78A8";
  if (strcmp(cat, "backward") == 0) return "#54A24B";
  if (strcmp(cat, "weight") == 0) return "#B279A2";
  if (strcmp(cat, "send") == 0 || strcmp(cat, "recv") == 0) return "#BAB0AC";
  if (strcmp(cat, "reduce") == 0) return "#F58518";
  return "#FFFFFF";
}

/* What a drawing reads off a trace: its spans, each rank's buffer counter, and the header's schedule and bubbles. */
typedef struct {
  span *spans;
  level *levels;
  int n, cap, ranks, nlevels, level_cap, most_held;
  double end, measured, theory;
  char schedule[32];
  const char *kind; /* "measured" or "predicted" */
} drawing;

static void drawing_free(drawing *d) {
  free(d->spans);
  free(d->levels);
}

/* A span line: kept (microseconds of one step: finite, not negative, under a day, on a rank a drawing can hold). */
static loom_status read_span(drawing *d, const char *at, const char *path, loom_error *err) {
  span s;
  if (sscanf(at, "{\"name\": \"%63[^\"]\", \"cat\": \"%15[^\"]\", \"ph\": \"X\", \"ts\": %lf, \"dur\": %lf, \"pid\": 0, \"tid\": %d",
             s.name, s.cat, &s.ts, &s.dur, &s.tid) != 5)
    return LOOM_OK;
  if (!(s.ts >= 0 && s.dur >= 0 && s.ts + s.dur <= 8.64e10) || s.tid < 0 || s.tid >= 65536)
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: span \"%s\" has ts %g, dur %g, tid %d: a span is microseconds within a "
                     "day of the step's start (ts, dur >= 0) on a rank 0 to 65535", path, s.name, s.ts, s.dur, s.tid);
  if (d->n == d->cap) d->spans = realloc(d->spans, (size_t)(d->cap = d->cap ? 2 * d->cap : 256) * sizeof *d->spans);
  LOOM_CHECK(d->spans != NULL, "out of memory reading a trace");
  d->spans[d->n++] = s;
  d->ranks = s.tid + 1 > d->ranks ? s.tid + 1 : d->ranks;
  d->end = fmax(d->end, s.ts + s.dur);
  return LOOM_OK;
}

/* A buffer counter line: kept when in range (one out of range is not drawn). */
static void read_level(drawing *d, const char *at) {
  level l;
  int slots, states, sends;
  if (sscanf(at, "{\"name\": \"buffers, rank %*d\", \"ph\": \"C\", \"ts\": %lf, \"pid\": 0, \"tid\": %d, \"args\": "
                 "{\"slots\": %d, \"weight_states\": %d, \"sends\": %d}", &l.ts, &l.tid, &slots, &states, &sends) != 5 ||
      !(l.ts >= 0 && l.ts <= 8.64e10) || l.tid < 0 || l.tid >= 65536 || slots < 0 || states < 0 || sends < 0 ||
      slots > 1 << 20 || states > 1 << 20 || sends > 1 << 20)
    return;
  if (d->nlevels == d->level_cap)
    d->levels = realloc(d->levels, (size_t)(d->level_cap = d->level_cap ? 2 * d->level_cap : 256) * sizeof *d->levels);
  LOOM_CHECK(d->levels != NULL, "out of memory reading a trace");
  l.held = slots + states + sends;
  d->most_held = l.held > d->most_held ? l.held : d->most_held;
  d->levels[d->nlevels++] = l;
}

/* The header: the schedule's name and the bubbles (a value that is not a share is not drawn). */
static void read_header(drawing *d, const char *line, const char *meta) {
  sscanf(meta, "\"schedule\": \"%31[^\"]\"", d->schedule);
  const char *b = strstr(line, "\"bubble_measured\": "), *predicted = strstr(line, "\"bubble_predicted\": ");
  if (b) sscanf(b, "\"bubble_measured\": %lf, \"bubble_theory\": %lf", &d->measured, &d->theory);
  else if (predicted && sscanf(predicted, "\"bubble_predicted\": %lf, \"bubble_theory\": %lf", &d->measured, &d->theory) == 2)
    d->kind = "predicted";
  if (!(d->measured >= -1 && d->measured <= 1 && d->theory >= -1 && d->theory <= 1)) d->measured = d->theory = -1.0;
}

static loom_status read_trace(const char *path, drawing *d, loom_error *err) {
  *d = (drawing){.measured = -1.0, .theory = -1.0, .schedule = "?", .kind = "measured"};
  FILE *in = NULL;
  loom_status st = loom_open_for_reading(path, "trace", &in, err);
  char line[1024];
  while (st == LOOM_OK && fgets(line, sizeof line, in)) {
    const char *at = strstr(line, "{\"name\": \"");
    if (at) st = read_span(d, at, path, err);
    at = strstr(line, "{\"name\": \"buffers, rank ");
    if (at) read_level(d, at);
    const char *meta = strstr(line, "\"schedule\": \"");
    if (meta) read_header(d, line, meta);
  }
  if (in) fclose(in);
  if (st == LOOM_OK && (d->n == 0 || d->end <= 0.0))
    st = loom_fail(err, LOOM_ERR_FORMAT, "%s: no trace spans found (write one with loom train --trace)", path);
  return st;
}

enum { LEFT = 70, WIDTH = 1000, ROW = 34, TOP = 40 };

/* Each rank's buffers held, as a step line along the bottom of its row. */
static void draw_levels(FILE *out, const drawing *d, double scale) {
  for (int i = 0; i < d->nlevels && d->most_held > 0; i++) {
    const level *l = &d->levels[i];
    if (l->tid >= d->ranks) continue;
    const bool last = i + 1 == d->nlevels || d->levels[i + 1].tid != l->tid;
    const double x0 = LEFT + l->ts * scale, x1 = LEFT + (last ? d->end : fmax(d->levels[i + 1].ts, l->ts)) * scale;
    const double y = TOP + ROW * (l->tid + 1) - 3.0 - (ROW - 10.0) * 0.4 * l->held / d->most_held;
    fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#D62728\" stroke-width=\"1.2\"/>\n", x0, y, x1, y);
    if (!last) {
      const double next = TOP + ROW * (l->tid + 1) - 3.0 - (ROW - 10.0) * 0.4 * d->levels[i + 1].held / d->most_held;
      fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#D62728\" stroke-width=\"1.2\"/>\n", x1, y, x1, next);
    }
  }
}

static void draw_legend(FILE *out, const drawing *d) {
  const double ly = TOP + ROW * d->ranks + 25.0;
  const char *legend[][2] = {{"forward", "forward"}, {"backward", "backward (B)"}, {"weight", "weight grads (W)"},
                             {"send", "send/recv"}, {"reduce", "reductions, step"}};
  for (int k = 0; k < 5; k++)
    fprintf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\" stroke=\"#666\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
            LEFT + 150.0 * k, ly - 10.0, fill_of(legend[k][0]), LEFT + 150.0 * k + 18.0, ly, legend[k][1]);
  if (d->most_held > 0)
    fprintf(out, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#D62728\" stroke-width=\"2\"/><text x=\"%.0f\" y=\"%.0f\">buffers held (at most %d)</text>\n",
            LEFT + 750.0, ly - 4.0, LEFT + 762.0, ly - 4.0, LEFT + 768.0, ly, d->most_held);
}

static void draw(FILE *out, const drawing *d) {
  const double scale = WIDTH / d->end, height = TOP + ROW * d->ranks + 50.0;
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
          LEFT + WIDTH + 20, height);
  fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(out, "<text x=\"%d\" y=\"22\" font-size=\"14\">%s schedule: one training step, %.2f ms; bubble %s %.1f%%, theory %.1f%%</text>\n",
          LEFT, d->schedule, d->end / 1000.0, d->kind, 100.0 * d->measured, 100.0 * d->theory);
  for (int r = 0; r < d->ranks; r++) fprintf(out, "<text x=\"8\" y=\"%.1f\">rank %d</text>\n", TOP + ROW * r + ROW * 0.6, r);
  for (int i = 0; i < d->n; i++) {
    const span *s = &d->spans[i];
    const double x = LEFT + s->ts * scale, w = fmax(s->dur * scale, 0.5), y = TOP + ROW * s->tid + 3.0;
    fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"#666\" stroke-width=\"0.3\"><title>%s</title></rect>\n",
            x, y, w, ROW - 6.0, fill_of(s->cat), s->name);
    if ((s->name[0] == 'F' || s->name[0] == 'B') && w > 14.0)
      fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" fill=\"white\" text-anchor=\"middle\">%s</text>\n", x + w / 2, y + ROW * 0.5, s->name);
  }
  draw_levels(out, d, scale);
  draw_legend(out, d);
  fprintf(out, "</svg>\n");
}

loom_status loom_trace_svg(const char *json_path, const char *svg_path, loom_error *err) {
  drawing d;
  loom_status st = read_trace(json_path, &d, err);
  FILE *out = st == LOOM_OK ? fopen(svg_path, "w") : NULL;
  if (st == LOOM_OK && !out) st = loom_fail(err, LOOM_ERR_IO, "%s: cannot open for writing: %s", svg_path, strerror(errno));
  if (out) {
    draw(out, &d);
    if (fclose(out) != 0) st = loom_fail(err, LOOM_ERR_WRITE, "%s: write failed", svg_path);
  }
  drawing_free(&d);
  return st;
}
