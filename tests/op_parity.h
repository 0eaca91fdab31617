/* Backend parity as one table, in the manner of ggml's test-backend-ops:
 * every op of a backend against the reference backend on the same inputs
 * (fixed seeds, odd shapes), outputs compared by NMSE within the backend's
 * fp32 bound (exactly where the op only moves or masks values), each output
 * followed by sentinels that must survive. The same cases run on every
 * backend compiled in: test_ops runs them on the CPU backend, and
 * tests/gpu/test_backend_cuda on the CUDA one. */
#ifndef LOOM_OP_PARITY_H
#define LOOM_OP_PARITY_H

#include <stddef.h>
#include "backend/ops.h"

/* A backend under test; its memory is its own (ops->mem). */
typedef struct {
  const char *name;
  const loom_ops *ops;
  double fp32_nmse; /* summation order and the backend's math library */
} op_backend;

/* What one case found: failures, and the first one's description. */
typedef struct {
  int checks, failures;
  char first[256];
} op_report;

#define OP_CASE_MAX_ENTRIES 8

typedef struct {
  const char *name;
  void (*run)(const op_backend *b, op_report *r);
  size_t entries[OP_CASE_MAX_ENTRIES]; /* offsetof(loom_ops, op) of each op it checks */
  int nentries;
} op_case;

extern const op_case OP_CASES[];
extern const int OP_CASE_COUNT;

/* The CPU backend, on host memory, and the guarded one (the CPU kernels on memory the host cannot touch). */
op_backend op_backend_cpu(void);
op_backend op_backend_guarded(void);
/* The number of function entries of the op table, and entry k of ops (NULL if unset). */
int op_table_entries(void);
void (*op_table_entry(const loom_ops *ops, int k))(void);
/* offsetof(loom_ops, ...) of entry k. */
size_t op_table_offset(int k);

#endif
