/* Facts about the machine a run is on. */
#ifndef LOOM_SYSINFO_H
#define LOOM_SYSINFO_H

#include <stddef.h>

/* Memory the kernel says new allocations can use without swapping
 * (MemAvailable), or physical memory if that is unknown. */
size_t loom_mem_available_bytes(void);
/* This process's peak resident memory so far, in bytes. */
size_t loom_peak_rss_bytes(void);

#endif
