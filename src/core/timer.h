/* Monotonic wall-clock timer. */
#ifndef LOOM_TIMER_H
#define LOOM_TIMER_H

#include <time.h>

static inline double loom_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
