/* Temp-file-and-rename writer. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "core/write_file.h"

loom_status loom_write_file_atomic(const char *path, const loom_chunk *chunks, int count, loom_error *err) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: path too long", path);
  FILE *fp = fopen(tmp, "wb");
  if (!fp) return loom_fail(err, LOOM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  for (int i = 0; i < count; i++) {
    if (chunks[i].bytes && fwrite(chunks[i].data, 1, chunks[i].bytes, fp) != chunks[i].bytes) {
      const int e = errno;
      fclose(fp);
      unlink(tmp);
      return loom_fail(err, LOOM_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
  }
  const int flushed = fflush(fp) == 0 && fsync(fileno(fp)) == 0;
  const int e = errno;
  if (fclose(fp) != 0 || !flushed) {
    unlink(tmp);
    return loom_fail(err, LOOM_ERR_IO, "%s: write failed: %s", path, strerror(flushed ? errno : e));
  }
  if (rename(tmp, path) != 0) {
    const int e = errno;
    unlink(tmp);
    return loom_fail(err, LOOM_ERR_IO, "%s: cannot rename into place: %s", path, strerror(e));
  }
  return LOOM_OK;
}
