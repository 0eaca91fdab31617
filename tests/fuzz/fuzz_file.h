/* Fuzz inputs as files: the loaders of model, token and shard files take a
 * path, so a harness hands them its bytes through an anonymous in-memory
 * file (memfd) and its /proc/self/fd path: nothing touches the disk. */
#ifndef LOOM_FUZZ_FILE_H
#define LOOM_FUZZ_FILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int fd;
  char path[64];
} fuzz_file;

/* Holds data in f (aborts if the kernel refuses a memfd: the harness cannot run). */
void fuzz_file_open(fuzz_file *f, const uint8_t *data, size_t size);
void fuzz_file_close(fuzz_file *f);

#endif
