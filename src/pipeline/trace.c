/* Trace gathering, JSON writing and SVG drawing. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/read_file.h"
#include "core/check.h"
#include "pipeline/executor_state.h"
#include "pipeline/trace.h"
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
    const float *e = info->ring + 4 * (size_t)i;
    fprintf(fp, ",\n{\"name\": \"%s\", \"cat\": \"ring\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 1, \"tid\": %d}",
            LOOM_RING_SPAN_NAMES[(int)e[1]], (double)e[2], (double)(e[3] - e[2]), (int)e[0]);
  }
  fprintf(fp, "\n],\n\"displayTimeUnit\": \"ms\",\n\"loom\": {\"ranks\": %d, \"pp\": %d, \"vpp\": %d, "
              "\"micro_batches\": %d, \"schedule\": \"%s\", \"%s\": %.4f, \"bubble_theory\": %.4f}}\n",
          info->ranks, info->pp, info->vpp, info->m, info->schedule, info->bubble_label, info->bubble, info->theory);
  if (fclose(fp) != 0) return loom_fail(err, LOOM_ERR_WRITE, "--trace %s: write failed", path);
  return LOOM_OK;
}

/* Every rank's ring spans, gathered on every rank: [rank, kind, start, end] each, their count in *n; *sum gets
 * each kind's mean time per rank. NULL when no rank kept any. */
static float *gather_ring(const loom_pipeline *pipe, loom_comm *world, int *n, loom_trace_summary *sum) {
  const loom_ring_log *g = &pipe->ring_log;
  const int ranks = loom_comm_size(world);
  float most = (float)g->count;
  loom_comm_allreduce(world, &most, 1, LOOM_REDUCE_MAX);
  const int width = (int)most;
  *n = 0;
  if (width == 0) return NULL;
  float *mine = loom_xmalloc((size_t)width * 3 * sizeof(float), "ring trace");
  float *all = loom_xmalloc((size_t)width * 3 * ranks * sizeof(float), "ring trace");
  float *out = loom_xmalloc((size_t)width * 4 * ranks * sizeof(float), "ring trace");
  for (int i = 0; i < width * 3; i++) mine[i] = i < g->count * 3 ? g->spans[i] : -1.0f;
  loom_comm_allgather(world, mine, all, (size_t)width * 3);
  for (int r = 0; r < ranks; r++)
    for (int i = 0; i < width; i++) {
      const float *e = all + ((size_t)r * width + i) * 3;
      if (e[0] < 0) continue;
      float *o = out + 4 * (size_t)(*n)++;
      o[0] = (float)r, o[1] = e[0], o[2] = e[1], o[3] = e[2];
      sum->ring_us[(int)e[0]] += (double)(e[2] - e[1]) / ranks;
    }
  free(mine);
  free(all);
  return out;
}

loom_status loom_trace_write(const loom_pipeline *pipe, loom_comm *world, const char *path, loom_trace_summary *sum,
                             loom_error *err) {
  *sum = (loom_trace_summary){0};
  double *bubble = &sum->bubble;
  int nring;
  float *ring = gather_ring(pipe, world, &nring, sum);
  const int ranks = loom_comm_size(world), F = LOOM_TRACE_FIELDS;
  float most = (float)pipe->trace_count;
  loom_comm_allreduce(world, &most, 1, LOOM_REDUCE_MAX);
  const int width = (int)most;
  float *mine = loom_xmalloc((size_t)width * F * sizeof(float), "trace");
  float *all = loom_xmalloc((size_t)width * F * ranks * sizeof(float), "trace");
  for (int i = 0; i < width * F; i++) mine[i] = i < pipe->trace_count * F ? pipe->trace[i] : -1.0f;
  loom_comm_allgather(world, mine, all, (size_t)width * F);
  /* Measured bubble: idle share of the step, averaged over ranks. */
  double makespan = 0.0, busy_sum = 0.0;
  for (int r = 0; r < ranks; r++)
    for (int i = 0; i < width; i++) {
      const float *e = all + ((size_t)r * width + i) * F;
      if (e[0] < 0) continue;
      makespan = fmax(makespan, e[4]);
      if (loom_action_computes(&(loom_action){.kind = (loom_action_kind)e[0]})) busy_sum += e[4] - e[3];
    }
  *bubble = makespan > 0.0 ? 1.0 - busy_sum / ranks / makespan : 0.0;
  loom_status st = LOOM_OK;
  if (loom_comm_rank(world) == 0) {
    loom_trace_span *spans = loom_xmalloc((size_t)width * ranks * sizeof *spans + 1, "trace");
    int n = 0;
    for (int r = 0; r < ranks; r++) {
      const loom_parallel *ps = pipe->ps;
      const int pp_rank = loom_parallel_coords(r, (loom_grid_coords){ps->tp, ps->cp, ps->dp, ps->pp}).pp;
      for (int i = 0; i < width; i++) {
        const float *e = all + ((size_t)r * width + i) * F;
        if (e[0] >= 0) spans[n++] = (loom_trace_span){r, (int)e[0], (int)e[1], (int)e[2], e[3], e[4], pp_rank, (int)e[5]};
      }
    }
    const loom_trace_info info = {ranks, pipe->ps->pp, pipe->v, pipe->m, loom_schedule_kind_name(pipe->sched->kind),
                                  "bubble_measured", *bubble, loom_schedule_theory_bubble(pipe->sched), pipe->sched,
                                  ring, nring};
    st = loom_trace_write_json(path, spans, n, &info, err);
    free(spans);
  }
  free(mine);
  free(all);
  free(ring);
  return st;
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

loom_status loom_trace_svg(const char *json_path, const char *svg_path, loom_error *err) {
  FILE *in;
  const loom_status opened = loom_open_for_reading(json_path, "trace", &in, err);
  if (opened != LOOM_OK) return opened;
  span *spans = NULL;
  level *levels = NULL;
  int n = 0, cap = 0, ranks = 0, nlevels = 0, level_cap = 0, most_held = 0;
  double end = 0.0, measured = -1.0, theory = -1.0;
  char line[1024], schedule[32] = "?";
  const char *kind = "measured";
  while (fgets(line, sizeof line, in)) {
    span s;
    const char *at = strstr(line, "{\"name\": \"");
    if (at && sscanf(at, "{\"name\": \"%63[^\"]\", \"cat\": \"%15[^\"]\", \"ph\": \"X\", \"ts\": %lf, \"dur\": %lf, \"pid\": 0, \"tid\": %d",
                     s.name, s.cat, &s.ts, &s.dur, &s.tid) == 5) {
      /* Microseconds of one step: finite, not negative, under a day; a rank a drawing can hold. */
      if (!(s.ts >= 0 && s.dur >= 0 && s.ts + s.dur <= 8.64e10) || s.tid < 0 || s.tid >= 65536) {
        fclose(in);
        free(spans);
        return loom_fail(err, LOOM_ERR_FORMAT, "%s: span \"%s\" has ts %g, dur %g, tid %d: a span is microseconds within a "
                         "day of the step's start (ts, dur >= 0) on a rank 0 to 65535", json_path, s.name, s.ts, s.dur, s.tid);
      }
      if (n == cap) spans = realloc(spans, (size_t)(cap = cap ? 2 * cap : 256) * sizeof *spans);
      LOOM_CHECK(spans != NULL, "out of memory reading a trace");
      spans[n++] = s;
      ranks = s.tid + 1 > ranks ? s.tid + 1 : ranks;
      end = fmax(end, s.ts + s.dur);
    }
    level l;
    int slots, states, sends;
    at = strstr(line, "{\"name\": \"buffers, rank ");
    if (at && sscanf(at, "{\"name\": \"buffers, rank %*d\", \"ph\": \"C\", \"ts\": %lf, \"pid\": 0, \"tid\": %d, \"args\": "
                         "{\"slots\": %d, \"weight_states\": %d, \"sends\": %d}", &l.ts, &l.tid, &slots, &states, &sends) == 5 &&
        l.ts >= 0 && l.ts <= 8.64e10 && l.tid >= 0 && l.tid < 65536 && slots >= 0 && states >= 0 && sends >= 0 &&
        slots <= 1 << 20 && states <= 1 << 20 && sends <= 1 << 20) { /* a counter out of range is not drawn */
      if (nlevels == level_cap) levels = realloc(levels, (size_t)(level_cap = level_cap ? 2 * level_cap : 256) * sizeof *levels);
      LOOM_CHECK(levels != NULL, "out of memory reading a trace");
      l.held = slots + states + sends;
      most_held = l.held > most_held ? l.held : most_held;
      levels[nlevels++] = l;
    }
    const char *meta = strstr(line, "\"schedule\": \"");
    if (meta) {
      sscanf(meta, "\"schedule\": \"%31[^\"]\"", schedule);
      const char *b = strstr(line, "\"bubble_measured\": ");
      const char *predicted = strstr(line, "\"bubble_predicted\": ");
      if (b) sscanf(b, "\"bubble_measured\": %lf, \"bubble_theory\": %lf", &measured, &theory);
      else if (predicted && sscanf(predicted, "\"bubble_predicted\": %lf, \"bubble_theory\": %lf", &measured, &theory) == 2)
        kind = "predicted";
      if (!(measured >= -1 && measured <= 1 && theory >= -1 && theory <= 1)) measured = theory = -1.0; /* not a share: not drawn */
    }
  }
  fclose(in);
  if (n == 0 || end <= 0.0) {
    free(spans);
    free(levels);
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: no trace spans found (write one with loom train --trace)", json_path);
  }
  FILE *out = fopen(svg_path, "w");
  if (!out) {
    free(spans);
    free(levels);
    return loom_fail(err, LOOM_ERR_IO, "%s: cannot open for writing: %s", svg_path, strerror(errno));
  }
  const double left = 70.0, width = 1000.0, row = 34.0, top = 40.0, scale = width / end;
  const double height = top + row * ranks + 50.0;
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
          left + width + 20.0, height);
  fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(out, "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s schedule: one training step, %.2f ms; bubble %s %.1f%%, theory %.1f%%</text>\n",
          left, schedule, end / 1000.0, kind, 100.0 * measured, 100.0 * theory);
  for (int r = 0; r < ranks; r++)
    fprintf(out, "<text x=\"8\" y=\"%.1f\">rank %d</text>\n", top + row * r + row * 0.6, r);
  for (int i = 0; i < n; i++) {
    const span *s = &spans[i];
    const double x = left + s->ts * scale, w = fmax(s->dur * scale, 0.5), y = top + row * s->tid + 3.0;
    fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"#666\" stroke-width=\"0.3\"><title>%s</title></rect>\n",
            x, y, w, row - 6.0, fill_of(s->cat), s->name);
    if ((s->name[0] == 'F' || s->name[0] == 'B') && w > 14.0)
      fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" fill=\"white\" text-anchor=\"middle\">%s</text>\n", x + w / 2,
              y + row * 0.5, s->name);
  }
  /* Each rank's buffers held, as a step line along the bottom of its row. */
  for (int i = 0; i < nlevels && most_held > 0; i++) {
    const level *l = &levels[i];
    if (l->tid >= ranks) continue;
    const bool last = i + 1 == nlevels || levels[i + 1].tid != l->tid;
    const double x0 = left + l->ts * scale, x1 = left + (last ? end : fmax(levels[i + 1].ts, l->ts)) * scale;
    const double y = top + row * (l->tid + 1) - 3.0 - (row - 10.0) * 0.4 * l->held / most_held;
    fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#D62728\" stroke-width=\"1.2\"/>\n", x0, y, x1, y);
    if (!last) {
      const double next = top + row * (l->tid + 1) - 3.0 - (row - 10.0) * 0.4 * levels[i + 1].held / most_held;
      fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#D62728\" stroke-width=\"1.2\"/>\n", x1, y, x1, next);
    }
  }
  const double ly = top + row * ranks + 25.0;
  const char *legend[][2] = {{"forward", "forward"}, {"backward", "backward (B)"}, {"weight", "weight grads (W)"},
                             {"send", "send/recv"}, {"reduce", "reductions, step"}, {"idle", "idle"}};
  for (int k = 0; k < 5; k++) {
    fprintf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\" stroke=\"#666\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
            left + 150.0 * k, ly - 10.0, fill_of(legend[k][0]), left + 150.0 * k + 18.0, ly, legend[k][1]);
  }
  if (most_held > 0)
    fprintf(out, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#D62728\" stroke-width=\"2\"/><text x=\"%.0f\" y=\"%.0f\">buffers held (at most %d)</text>\n",
            left + 750.0, ly - 4.0, left + 762.0, ly - 4.0, left + 768.0, ly, most_held);
  fprintf(out, "</svg>\n");
  free(spans);
  free(levels);
  if (fclose(out) != 0) return loom_fail(err, LOOM_ERR_WRITE, "%s: write failed", svg_path);
  return LOOM_OK;
}
