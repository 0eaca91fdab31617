/* Draws a verified schedule as a rank x time grid in the terminal: one cell
 * per forward of one chunk, a backward spans two; "." is idle. */
#ifndef LOOM_SCHEDULE_RENDER_H
#define LOOM_SCHEDULE_RENDER_H

#include <stdio.h>
#include "schedule/verify.h"

void loom_schedule_render(FILE *fp, const loom_schedule *s, const loom_schedule_report *rep);

#endif
