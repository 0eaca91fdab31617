/* NVML through dlopen: only the handful of calls preflight reads, declared
 * here with NVML's C types (an opaque device handle, int return codes). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "core/nvml.h"

typedef void *nvml_device;
enum { NVML_CLOCK_SM = 1, NVML_TEMPERATURE_GPU = 0, NVML_ERROR_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0 };

typedef struct {
  int (*init)(void);
  int (*handle)(unsigned index, nvml_device *dev);
  int (*clock)(nvml_device dev, int type, unsigned *mhz);
  int (*max_clock)(nvml_device dev, int type, unsigned *mhz);
  int (*temperature)(nvml_device dev, int sensor, unsigned *c);
  int (*throttle)(nvml_device dev, unsigned long long *reasons);
  int (*ecc)(nvml_device dev, int error_type, int counter, unsigned long long *count);
} nvml_api;

static bool open_nvml(nvml_api *api, char *why, size_t len) {
  static void *lib;
  if (!lib) lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why, len, "no NVML (libnvidia-ml.so.1 is not installed)");
    return false;
  }
  *(void **)&api->init = dlsym(lib, "nvmlInit_v2");
  *(void **)&api->handle = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&api->clock = dlsym(lib, "nvmlDeviceGetClockInfo");
  *(void **)&api->max_clock = dlsym(lib, "nvmlDeviceGetMaxClockInfo");
  *(void **)&api->temperature = dlsym(lib, "nvmlDeviceGetTemperature");
  *(void **)&api->throttle = dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
  *(void **)&api->ecc = dlsym(lib, "nvmlDeviceGetTotalEccErrors");
  if (!api->init || !api->handle || !api->clock || !api->max_clock || !api->temperature || !api->throttle || !api->ecc) {
    snprintf(why, len, "NVML lacks a call preflight reads (%s)", dlerror());
    return false;
  }
  return true;
}

bool loom_nvml_read(int index, loom_gpu_health *out, char *why, size_t len) {
  memset(out, 0, sizeof *out);
  nvml_api api;
  if (!open_nvml(&api, why, len)) return false;
  nvml_device dev;
  int rc = api.init();
  if (rc == 0) rc = api.handle((unsigned)index, &dev);
  if (rc != 0) {
    snprintf(why, len, "NVML cannot open GPU %d (error %d)", index, rc);
    return false;
  }
  unsigned long long throttle = 0, ecc = 0;
  api.clock(dev, NVML_CLOCK_SM, &out->sm_mhz);
  api.max_clock(dev, NVML_CLOCK_SM, &out->max_sm_mhz);
  api.temperature(dev, NVML_TEMPERATURE_GPU, &out->temp_c);
  api.throttle(dev, &throttle);
  if (api.ecc(dev, NVML_ERROR_UNCORRECTED, NVML_VOLATILE_ECC, &ecc) != 0) ecc = 0; /* ECC off */
  out->throttle = throttle, out->ecc_uncorrected = ecc;
  return true;
}

const char *loom_nvml_bad_throttle(uint64_t throttle, char *buf, size_t len) {
  static const struct { uint64_t bit; const char *name; } BAD[] = {
      {0x8, "hardware slowdown"}, {0x20, "software thermal"}, {0x40, "hardware thermal"}, {0x80, "power brake"}};
  size_t used = 0;
  buf[0] = '\0';
  for (size_t k = 0; k < sizeof BAD / sizeof BAD[0]; k++)
    if ((throttle & BAD[k].bit) && used < len)
      used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", BAD[k].name);
  return buf;
}
