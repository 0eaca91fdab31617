/* Machine facts read from /proc and sysconf, and CPU affinity. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "core/sysinfo.h"

size_t loom_mem_available_bytes(void) {
  FILE *fp = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kib = 0;
  while (fp && fgets(line, sizeof line, fp)) {
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  if (fp) fclose(fp);
  if (kib) return (size_t)kib * 1024;
  return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

size_t loom_peak_rss_bytes(void) {
  struct rusage u;
  return getrusage(RUSAGE_SELF, &u) == 0 ? (size_t)u.ru_maxrss * 1024 : 0; /* Linux reports KiB */
}

void loom_cpu_affinity(loom_cpu_mask *out) {
  memset(out, 0, sizeof *out);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  for (int c = 0; c < LOOM_CPU_MASK_WORDS * 64 && c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) out->bits[c / 64] |= 1ull << (c % 64);
}

int loom_cpu_set_affinity(const loom_cpu_mask *mask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0; c < LOOM_CPU_MASK_WORDS * 64 && c < CPU_SETSIZE; c++)
    if (mask->bits[c / 64] >> (c % 64) & 1) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof set, &set);
}

int loom_cpu_mask_count(const loom_cpu_mask *mask) {
  int n = 0;
  for (int w = 0; w < LOOM_CPU_MASK_WORDS; w++) n += __builtin_popcountll(mask->bits[w]);
  return n;
}

const char *loom_cpu_model(char *buf, size_t n) {
  snprintf(buf, n, "unknown CPU");
  FILE *fp = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (fp && fgets(line, sizeof line, fp)) {
    const char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    colon += 1 + (colon[1] == ' ');
    snprintf(buf, n, "%.*s", (int)strcspn(colon, "\n"), colon);
    break;
  }
  if (fp) fclose(fp);
  return buf;
}
