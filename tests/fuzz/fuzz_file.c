#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "fuzz_file.h"

void fuzz_file_open(fuzz_file *f, const uint8_t *data, size_t size) {
  f->fd = memfd_create("loom-fuzz", 0);
  if (f->fd < 0) {
    perror("memfd_create");
    abort();
  }
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(f->fd, data + done, size - done);
    if (n <= 0) {
      perror("write to memfd");
      abort();
    }
    done += (size_t)n;
  }
  snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

void fuzz_file_close(fuzz_file *f) { close(f->fd); }
