/* Opening a regular file for reading. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include "core/read_file.h"

loom_status loom_open_for_reading(const char *path, const char *what, FILE **fp, loom_error *err) {
  *fp = fopen(path, "rb");
  struct stat sb;
  if (!*fp || fstat(fileno(*fp), &sb) != 0) {
    const loom_status st = loom_fail(err, LOOM_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
    if (*fp) fclose(*fp);
    *fp = NULL;
    return st;
  }
  if (S_ISREG(sb.st_mode)) return LOOM_OK;
  fclose(*fp);
  *fp = NULL;
  return loom_fail(err, LOOM_ERR_IO, "%s: is a %s, not a %s", path, S_ISDIR(sb.st_mode) ? "directory" : "special file", what);
}
