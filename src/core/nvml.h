/* A GPU's health through NVML, opened at run time (libnvidia-ml.so.1, as the
 * driver installs it), so loom builds and runs where there is none: clocks,
 * temperature, the reasons its clocks are held down, and uncorrected ECC
 * errors. */
#ifndef LOOM_NVML_H
#define LOOM_NVML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  unsigned sm_mhz, max_sm_mhz, temp_c;
  uint64_t throttle; /* NVML's clocks-throttle-reason bits */
  uint64_t ecc_uncorrected; /* since the driver loaded; 0 where ECC is off */
} loom_gpu_health;

/* Reads device `index`; false with *why set when NVML or the device is not there. */
bool loom_nvml_read(int index, loom_gpu_health *out, char *why, size_t len);
/* The throttle reasons that slow a device against its will (thermal, power
 * brake, hardware slowdown), named into buf ("" when none). */
const char *loom_nvml_bad_throttle(uint64_t throttle, char *buf, size_t len);

#endif
