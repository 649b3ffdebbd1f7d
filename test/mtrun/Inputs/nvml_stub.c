/* A stand-in for NVML (libnvidia-ml.so.1) with the functions mtrun's power
 * log calls, for testing it without a GPU. It shows two GPUs, index 0 and 1
 * (UUIDs GPU-stub-0 and GPU-stub-1); each reading is a fixed figure, except
 * power, which climbs by 1 W per reading from 300 W and wraps at 400 W.
 * NVML_STUB_NO_POWER=1: power is not supported (NVML_ERROR_NOT_SUPPORTED).
 * NVML_STUB_NO_GPU=1: nvmlDeviceGetCount reports none. */
#include <stdlib.h>
#include <string.h>

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
  unsigned gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

static struct nvmlDevice_st {
  int index;
} devices[2] = {{0}, {1}};
static unsigned power_reads;

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 6 ? "Not Found" : r == 3 ? "Not Supported" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned *n) {
  *n = getenv("NVML_STUB_NO_GPU") ? 0 : 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
  if (i >= 2)
    return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *d = &devices[i];
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
  if (strcmp(uuid, "GPU-stub-0") == 0 || strcmp(uuid, "GPU-stub-1") == 0) {
    *d = &devices[uuid[9] - '0'];
    return 0;
  }
  return 6; /* NVML_ERROR_NOT_FOUND */
}
int nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned n) {
  const char *s = d->index == 0 ? "Stub GPU 0" : "Stub GPU 1";
  strncpy(name, s, n);
  name[n - 1] = 0;
  return 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned *mw) {
  (void)d;
  if (getenv("NVML_STUB_NO_POWER"))
    return 3;
  *mw = 300000 + 1000 * (power_reads++ % 100);
  return 0;
}
int nvmlDeviceGetClockInfo(nvmlDevice_t d, unsigned type, unsigned *mhz) {
  (void)d;
  *mhz = type == 1 ? 1980 : 2619;
  return 0;
}
int nvmlDeviceGetTemperature(nvmlDevice_t d, unsigned sensor, unsigned *c) {
  (void)sensor;
  *c = 40 + d->index;
  return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  (void)d;
  u->gpu = 97;
  u->memory = 41;
  return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  (void)d;
  m->total = 80ull << 30;
  m->used = 10ull << 30;
  m->free = m->total - m->used;
  return 0;
}
