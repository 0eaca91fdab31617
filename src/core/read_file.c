/* Opening a regular file for reading. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <stdlib.h>
#include "core/fault.h"
#include "core/read_file.h"

const char *loom_errno_words(int e) {
  return e == EACCES ? "permission denied" : e == ELOOP ? "a loop of symbolic links" : strerror(e);
}

loom_status loom_open_regular(const char *path, const char *what, int *fd, loom_error *err) {
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
  *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat sb;
  if (*fd < 0 || fstat(*fd, &sb) != 0) {
    const loom_status st = loom_fail(err, LOOM_ERR_IO, "%s: cannot open %s: %s", path, what, loom_errno_words(errno));
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return st;
  }
  if (S_ISREG(sb.st_mode)) {
    fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK);
    return LOOM_OK;
  }
  close(*fd);
  *fd = -1;
  return loom_fail(err, LOOM_ERR_IO, "%s: is a %s, not a %s", path,
                   S_ISDIR(sb.st_mode) ? "directory" : S_ISFIFO(sb.st_mode) ? "named pipe (FIFO)" : "special file", what);
}

loom_status loom_open_for_reading(const char *path, const char *what, FILE **fp, loom_error *err) {
  int fd;
  *fp = NULL;
  const loom_status st = loom_open_regular(path, what, &fd, err);
  if (st != LOOM_OK) return st;
  if (!(*fp = fdopen(fd, "rb"))) {
    close(fd);
    return loom_fail(err, LOOM_ERR_NOMEM, "%s: cannot open %s: %s", path, what, strerror(errno));
  }
  return LOOM_OK;
}

loom_status loom_read_small_file(const char *path, const char *what, size_t max, char **out, size_t *len, loom_error *err) {
  FILE *fp;
  loom_status st = loom_open_for_reading(path, what, &fp, err);
  if (st != LOOM_OK) return st;
  struct stat sb;
  fstat(fileno(fp), &sb);
  if ((uint64_t)sb.st_size > max) {
    fclose(fp);
    return loom_fail(err, LOOM_ERR_FORMAT, "%s: larger than the %zu bytes a %s may have", path, max, what);
  }
  /* Sized by the file, with one byte more to see whether it grew meanwhile. */
  const size_t size = (size_t)sb.st_size;
  char *buf = loom_fault_malloc(size + 2);
  const size_t n = buf ? fread(buf, 1, size + 1, fp) : 0;
  const int failed = buf && ferror(fp);
  fclose(fp);
  if (!buf) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory", path);
  if (failed || n != size) {
    free(buf);
    return loom_fail(err, LOOM_ERR_IO, "%s: read %zu bytes of %zu (read error, or the file changed while read)", path, n, size);
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return LOOM_OK;
}
