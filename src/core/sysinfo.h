/* Facts about the machine a run is on. */
#ifndef LOOM_SYSINFO_H
#define LOOM_SYSINFO_H

#include <stddef.h>
#include <stdint.h>

/* Memory the kernel says new allocations can use without swapping
 * (MemAvailable), or physical memory if that is unknown. */
size_t loom_mem_available_bytes(void);
/* This process's peak resident memory so far, in bytes. */
size_t loom_peak_rss_bytes(void);
/* The CPU's model name (/proc/cpuinfo's "model name"), for benchmarks'
 * reports; "unknown CPU" where the system does not say. */
const char *loom_cpu_model(char *buf, size_t n);

/* CPUs this thread may run on (the first 1024), e.g. as mpirun bound it. */
#define LOOM_CPU_MASK_WORDS 16
typedef struct {
  uint64_t bits[LOOM_CPU_MASK_WORDS];
} loom_cpu_mask;
void loom_cpu_affinity(loom_cpu_mask *out);
/* Returns 0, or -1 when the kernel refuses. */
int loom_cpu_set_affinity(const loom_cpu_mask *mask);
int loom_cpu_mask_count(const loom_cpu_mask *mask);

#endif
