/* Terminal rendering of a schedule's simulated timeline. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "schedule/render.h"

/* "F12", or "F12b" for chunk 1 when there are chunks; B for a backward or
 * its input half, W for its weight half. */
static void label(char *out, size_t n, const loom_schedule *s, const loom_action *a) {
  const char kind = a->kind == LOOM_ACT_FORWARD ? 'F' : a->kind == LOOM_ACT_BACKWARD_WEIGHT ? 'W' : 'B';
  if (s->v > 1) snprintf(out, n, "%c%d%c", kind, a->mb, 'a' + a->chunk);
  else snprintf(out, n, "%c%d", kind, a->mb);
}

void loom_schedule_render(FILE *fp, const loom_schedule *s, const loom_schedule_report *rep) {
  const int cells = (int)lround(rep->makespan * s->v);
  char probe[16];
  snprintf(probe, sizeof probe, "F%d%s", s->m - 1, s->v > 1 ? "a" : "");
  const int width = (int)strlen(probe) + 1;
  char *row = malloc((size_t)cells * (size_t)width + 1);
  for (int r = 0; r < s->p; r++) {
    memset(row, ' ', (size_t)cells * (size_t)width);
    for (int c = 0; c < cells; c++) row[c * width] = '.';
    for (int i = 0; i < rep->span_count[r]; i++) {
      const loom_span *sp = &rep->spans[r][i];
      char text[16];
      label(text, sizeof text, s, &s->actions[r][sp->action]);
      for (int c = (int)lround(sp->start * s->v); c < (int)lround(sp->end * s->v) && c < cells; c++) {
        memset(row + (size_t)c * width, ' ', (size_t)width);
        memcpy(row + (size_t)c * width, text, strlen(text));
      }
    }
    row[(size_t)cells * width] = '\0';
    fprintf(fp, "rank %d | %s\n", r, row);
  }
  free(row);
}
