/* Plan files, over the generic text format and protobuf-c's binary codec. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fault.h"
#include "core/read_file.h"
#include "core/strbuf.h"
#include "core/write_file.h"
#include "plan/plan_io.h"
#include "plan/textformat.h"

int loom_plan_is_text(const char *path) {
  return loom_str_ends_with(path, ".txtpb") || loom_str_ends_with(path, ".textproto") || loom_str_ends_with(path, ".pbtxt");
}

static loom_status slurp(const char *path, char **data, size_t *len, loom_error *err) {
  FILE *fp;
  const loom_status opened = loom_open_for_reading(path, "plan", &fp, err);
  if (opened != LOOM_OK) return opened;
  size_t cap = 4096, n = 0, got;
  char *buf = loom_fault_malloc(cap + 1);
  while (buf && (got = fread(buf + n, 1, cap - n, fp)) > 0) {
    n += got;
    if (n < cap) continue;
    char *bigger = loom_fault_realloc(buf, (cap *= 2) + 1);
    if (!bigger) free(buf);
    buf = bigger;
  }
  const int bad = ferror(fp);
  fclose(fp);
  if (!buf) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory reading the plan", path);
  if (bad) {
    free(buf);
    return loom_fail(err, LOOM_ERR_IO, "%s: read failed", path);
  }
  buf[n] = '\0';
  *data = buf;
  *len = n;
  return LOOM_OK;
}

/* protobuf-c's allocations through the fault registry, so tests can fail
 * them; data is a bool set when one fails. */
static void *fault_alloc(void *data, size_t size) {
  void *p = loom_fault_malloc(size);
  if (!p) *(bool *)data = true;
  return p;
}
static void fault_free(void *data, void *p) {
  (void)data;
  free(p);
}

loom_status loom_plan_decode(const char *data, size_t len, bool text, const char *path, loom_plan **out, loom_error *err) {
  *out = NULL;
  loom_status st = LOOM_OK;
  ProtobufCMessage *msg = NULL;
  if (text) {
    st = loom_text_parse(&loom__partition_plan__descriptor, data, len, &msg, err);
    if (st != LOOM_OK) return loom_error_prefix(err, st, path);
  } else {
    bool out_of_memory = false;
    ProtobufCAllocator allocator = {fault_alloc, fault_free, &out_of_memory};
    msg = (ProtobufCMessage *)loom__partition_plan__unpack(&allocator, len, (const uint8_t *)data);
    if (!msg && out_of_memory) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory decoding the plan", path);
    if (!msg) return loom_fail(err, LOOM_ERR_FORMAT, "%s: not a binary PartitionPlan (protobuf decoding failed)", path);
  }
  loom_plan *plan = (loom_plan *)msg;
  if (plan->has_format_version && plan->format_version > LOOM_PLAN_FORMAT_VERSION) {
    const unsigned version = plan->format_version;
    loom_plan_free(plan);
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: format_version %u is newer than this loom reads (%d); use a newer loom",
                     path, version, LOOM_PLAN_FORMAT_VERSION);
  }
  *out = plan;
  return LOOM_OK;
}

loom_status loom_plan_read(const char *path, loom_plan **out, loom_error *err) {
  *out = NULL;
  const int text = loom_plan_is_text(path);
  if (!text && !loom_str_ends_with(path, ".pb"))
    return loom_fail(err, LOOM_ERR_USAGE, "%s: a plan file ends in .txtpb (text) or .pb (binary)", path);
  char *data = NULL;
  size_t len = 0;
  const loom_status st = slurp(path, &data, &len, err);
  if (st != LOOM_OK) return st;
  const loom_status decoded = loom_plan_decode(data, len, text, path, out, err);
  free(data);
  return decoded;
}

loom_status loom_plan_write(const char *path, const loom_plan *plan, loom_error *err) {
  if (strcmp(path, "-") == 0) { /* standard output, text */
    char *text = loom_text_print(&plan->base);
    const bool ok = fputs(text, stdout) >= 0 && fflush(stdout) == 0;
    free(text);
    return ok ? LOOM_OK : loom_fail(err, LOOM_ERR_IO, "standard output: cannot write the plan");
  }
  if (loom_plan_is_text(path)) {
    char *text = loom_text_print(&plan->base);
    const loom_chunk chunk = {text, strlen(text)};
    const loom_status st = loom_write_file_atomic(path, &chunk, 1, err);
    free(text);
    return st;
  }
  if (!loom_str_ends_with(path, ".pb"))
    return loom_fail(err, LOOM_ERR_USAGE, "%s: a plan file ends in .txtpb (text) or .pb (binary)", path);
  const size_t n = loom__partition_plan__get_packed_size(plan);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  loom__partition_plan__pack(plan, buf);
  const loom_chunk chunk = {buf, n};
  const loom_status st = loom_write_file_atomic(path, &chunk, 1, err);
  free(buf);
  return st;
}

void loom_plan_free(loom_plan *plan) {
  if (plan) protobuf_c_message_free_unpacked(&plan->base, NULL);
}
