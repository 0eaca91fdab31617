/* The checkpoint pieces one rank holds: its parameter blocks and Adam
 * moments (whole blocks, or the runs of them inside its ZeRO pieces),
 * named canonically ("param/h.3.mlp.c_fc.weight", "adam_m/...", "adam_v/...")
 * and placed by global offsets. A tensor-parallel block of c_attn is three
 * pieces, its q, k and v rows, as each is contiguous in the global tensor
 * (and under ZeRO each such piece is cut again by the replica's pieces).
 *
 * Saving writes each element once: tensor-parallel replicas (norms, biases
 * after a row-parallel reduction, wpe) only from tp rank 0, data-parallel
 * replicas only from dp rank 0 (ZeRO moments, and in bf16 runs the
 * master weights, are already split; an expert-parallel run's experts from
 * their expert-data-parallel rank 0, wherever that is), and the
 * tied wte only from the first stage. Loading wants every element a rank
 * holds, and takes each from whichever rank of the old plan wrote it. */
#ifndef LOOM_CKPT_TENSORS_H
#define LOOM_CKPT_TENSORS_H

#include <stdbool.h>
#include "ckpt/shard_file.h"
#include "layers/gpt_params.h"
#include "optim/adamw.h"
#include "optim/grad_compress.h"
#include "optim/zero.h"

#define LOOM_SHARD_MAX_PARTS 4 /* row blocks of one tensor (c_attn has q, k, v) */

/* One model chunk of a rank with its optimizer state. */
typedef struct {
  loom_gpt_params *p;
  float *m, *v;        /* Adam moments of the runs' flat elements of p's buffer; NULL: parameters only */
  float *master;       /* the fp32 parameters of the runs when p holds none (the distributed optimizer's); else NULL */
  const loom_flat_run *runs; /* [nruns] this replica's ZeRO pieces, each with its place in m, v and master; */
  int nruns;                 /* NULL: the whole buffer */
  int *step;           /* the optimizer's step counter */
  /* Grad compression's state on this rank (error feedback, PowerSGD's Q),
   * saved as pieces named by the world rank `rank` under
   * LOOM_CKPT_COMPRESSION_PREFIX, which only a run of the same layout
   * resumes (loom_ckpt_resume decides); NULL: none. */
  loom_grad_compress *compress;
  int rank;
} loom_ckpt_chunk;

#define LOOM_CKPT_COMPRESSION_PREFIX "grad_compress/"

/* A chunk with plain AdamW state, or with this replica's ZeRO pieces of it. */
loom_ckpt_chunk loom_ckpt_chunk_adamw(loom_gpt_params *p, loom_adamw *opt);
loom_ckpt_chunk loom_ckpt_chunk_zero(loom_gpt_params *p, loom_zero *z);

/* A piece a loader wants, and the rows past which it may be zero (vocab padding). */
typedef struct {
  loom_shard_tensor t;
  int64_t valid_rows;
  bool padded; /* rows past valid_rows are vocab padding, which differs between tp sizes */
} loom_ckpt_want;

/* Upper bound on the pieces of n chunks. */
int loom_ckpt_max_pieces(const loom_ckpt_chunk *chunks, int n);
/* The pieces this rank writes (dp_rank picks the replica that writes
 * replicated state, edp_rank an expert-parallel run's experts' replica);
 * returns how many. `zero` says m and v are slices. */
int loom_ckpt_save_pieces(const loom_ckpt_chunk *chunks, int n, int dp_rank, int edp_rank, bool zero, loom_shard_tensor *out);
/* Every piece this rank holds, to be filled from a checkpoint. */
int loom_ckpt_load_pieces(const loom_ckpt_chunk *chunks, int n, loom_ckpt_want *out);

/* Pieces moved to host memory for the shard files, when their values live
 * in backend memory the host cannot address (a GPU's, the guarded
 * backend's); a no-op for host-addressable memory. */
typedef struct {
  const loom_allocator *mem;
  loom_shard_tensor *first; /* piece i is at first + i * stride bytes */
  size_t stride;
  int count;
  float **backend;          /* [count] each piece's own data pointer */
} loom_ckpt_staging;
/* Points each piece at a host buffer, holding a copy of its values when
 * `fill` (to save them). Fails only for want of memory, changing nothing. */
loom_status loom_ckpt_stage(loom_ckpt_staging *s, const loom_allocator *mem, loom_shard_tensor *first, size_t stride,
                            int count, bool fill, loom_error *err);
/* Points the pieces back at their backend memory, copying the host values
 * there first when `copy_back` (after a load). */
void loom_ckpt_unstage(loom_ckpt_staging *s, bool copy_back);
/* Bytes of the values this rank loads. */
int64_t loom_ckpt_load_bytes(const loom_ckpt_chunk *chunks, int n);

#endif
