/* Megatron-LM's memory-mapped indexed dataset: PREFIX.bin holds the tokens
 * of every sequence back to back; PREFIX.idx describes them:
 *
 *   "MMIDIDX\0\0"                      9 bytes
 *   version                            uint64, 1
 *   dtype code                         uint8 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)
 *   sequence count n                   uint64
 *   document count d                   uint64 (documents + 1)
 *   sequence lengths                   int32[n], in tokens
 *   sequence pointers                  int64[n], byte offsets into .bin
 *   document indices                   int64[d], 0 first, n last: document k is sequences [idx[k], idx[k+1])
 *
 * all little-endian and unaligned, as Megatron's _IndexWriter writes them.
 * Reading maps both files and checks every field before use. */
#ifndef LOOM_INDEXED_H
#define LOOM_INDEXED_H

#include <stdint.h>
#include <stdio.h>
#include "core/status.h"

#define LOOM_INDEXED_DTYPE_UINT16 8
#define LOOM_INDEXED_DTYPE_INT32 4

typedef struct {
  const unsigned char *bin, *idx; /* the mappings */
  size_t bin_bytes, idx_bytes;
  int dtype;                      /* dtype code */
  size_t item;                    /* bytes per token */
  int64_t sequences, documents;   /* documents: the count of document indices, one more than documents */
  const unsigned char *lengths, *pointers, *doc_index; /* unaligned arrays in idx */
} loom_indexed;

/* Opens PREFIX.bin and PREFIX.idx; every token must be below vocab. */
loom_status loom_indexed_open(loom_indexed *d, const char *prefix, int vocab, loom_error *err);
void loom_indexed_close(loom_indexed *d);
/* What open checks, on d->idx/idx_bytes and d->bin/bin_bytes already in
 * memory: every field of the index against both sizes, every token against
 * vocab; fills the rest of d. The paths name the files in messages. */
loom_status loom_indexed_check(loom_indexed *d, const char *idx_path, const char *bin_path, int vocab, loom_error *err);
/* Whether PREFIX.idx exists (a --data value names an indexed dataset). */
int loom_indexed_exists(const char *prefix);
int64_t loom_indexed_length(const loom_indexed *d, int64_t seq);
/* Tokens [from, from + count) of sequence seq into out. */
void loom_indexed_read(const loom_indexed *d, int64_t seq, int64_t from, int64_t count, int *out);

/* The dtype Megatron's preprocessing picks for a vocabulary: uint16 below 65500, else int32. */
int loom_indexed_dtype_for_vocab(int vocab);

/* Writing: sequences stream into PREFIX.bin.tmp; finishing writes PREFIX.idx
 * (atomically) and renames the .bin into place, so a failed run leaves no
 * half-written dataset under the final names. */
typedef struct {
  char *bin_path, *bin_tmp, *idx_path;
  FILE *bin;
  int dtype;
  int64_t *lengths;
  int64_t sequences, cap;
  int64_t *doc_index;
  int64_t documents, doc_cap;
  int64_t tokens;
} loom_indexed_writer;

loom_status loom_indexed_writer_open(loom_indexed_writer *w, const char *prefix, int dtype, loom_error *err);
/* Appends one sequence; ids must fit the dtype (checked by the caller). */
loom_status loom_indexed_add(loom_indexed_writer *w, const int32_t *ids, size_t count, loom_error *err);
/* Ends the current document (Megatron's end_document). */
void loom_indexed_end_document(loom_indexed_writer *w);
loom_status loom_indexed_writer_finish(loom_indexed_writer *w, loom_error *err);
/* Frees the writer and removes the temporary .bin if not finished. */
void loom_indexed_writer_free(loom_indexed_writer *w);

#endif
