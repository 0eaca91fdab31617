/* Machine facts read from /proc and sysconf. */
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
