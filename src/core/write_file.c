/* Temp-file-and-rename writer. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/read_file.h"
#include "core/write_file.h"

loom_status loom_write_file_atomic_stream(const char *path, loom_next_chunk next, void *ctx, loom_error *err) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return loom_fail(err, LOOM_ERR_USAGE, "%s: path too long", path);
  FILE *fp = fopen(tmp, "wb");
  if (!fp) return loom_fail(err, LOOM_ERR_WRITE, "%s: cannot create: %s", path, strerror(errno));
  loom_chunk chunk;
  loom_status st = LOOM_OK;
  for (int i = 0; st == LOOM_OK; i++) {
    const int more = next(ctx, i, &chunk, &st, err);
    if (!more || st != LOOM_OK) break;
    if (chunk.bytes && fwrite(chunk.data, 1, chunk.bytes, fp) != chunk.bytes)
      st = loom_fail(err, LOOM_ERR_WRITE, "%s: write failed: %s", path, strerror(errno));
  }
  const int flushed = st == LOOM_OK && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
  const int e = errno;
  if (fclose(fp) != 0 || !flushed) {
    unlink(tmp);
    return st != LOOM_OK ? st : loom_fail(err, LOOM_ERR_WRITE, "%s: write failed: %s", path, strerror(flushed ? errno : e));
  }
  if (rename(tmp, path) != 0) {
    const int re = errno;
    unlink(tmp);
    return loom_fail(err, LOOM_ERR_WRITE, "%s: cannot rename into place: %s", path, strerror(re));
  }
  return LOOM_OK;
}

typedef struct {
  const loom_chunk *chunks;
  int count;
} chunk_array;

static int next_of_array(void *ctx, int i, loom_chunk *out, loom_status *st, loom_error *err) {
  (void)st, (void)err;
  const chunk_array *a = ctx;
  if (i >= a->count) return 0;
  *out = a->chunks[i];
  return 1;
}

loom_status loom_write_file_atomic(const char *path, const loom_chunk *chunks, int count, loom_error *err) {
  chunk_array a = {chunks, count};
  return loom_write_file_atomic_stream(path, next_of_array, &a, err);
}

loom_status loom_make_dirs(const char *path, const char *what, loom_error *err) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return loom_fail(err, LOOM_ERR_USAGE, "%s: path too long", path);
  for (char *slash = strchr(dir + 1, '/');; slash = strchr(slash + 1, '/')) {
    if (slash) *slash = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return loom_fail(err, LOOM_ERR_WRITE, "%s: cannot create %s: %s", dir, what, strerror(errno));
    if (!slash) return LOOM_OK;
    *slash = '/';
  }
}

/* Creates and removes a file in dir: the one honest test of "can write here" (root ignores modes, not read-only mounts). */
static loom_status probe_dir(const char *flag, const char *path, const char *dir, loom_error *err) {
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.loom_probe_%d", dir, (int)getpid());
  const int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    const int e = errno;
    return loom_fail(err, LOOM_ERR_IO, "%s %s: cannot write there: %s", flag, path, loom_errno_words(e));
  }
  close(fd);
  unlink(probe);
  return LOOM_OK;
}

loom_status loom_output_check(const char *flag, const char *path, bool is_dir, bool force, loom_error *err) {
  if (!*path) return loom_fail(err, LOOM_ERR_USAGE, "%s '': an empty path names no %s", flag, is_dir ? "directory" : "file");
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return loom_fail(err, LOOM_ERR_USAGE, "%s %s: path too long", flag, path);
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (S_ISCHR(sb.st_mode)) return LOOM_OK; /* /dev/null and the like: written to, never replaced */
    const bool dir_there = S_ISDIR(sb.st_mode);
    if (!force)
      return loom_fail(err, LOOM_ERR_USAGE, "%s %s: %s exists there; add --force to replace it", flag, path,
                       dir_there ? "a directory" : S_ISREG(sb.st_mode) ? "a file" : "something");
    if (dir_there != is_dir || (!dir_there && !S_ISREG(sb.st_mode)))
      return loom_fail(err, LOOM_ERR_USAGE, "%s %s: %s is there where the output is %s; --force replaces only its own kind",
                       flag, path, dir_there ? "a directory" : "not a regular file", is_dir ? "a directory" : "a file");
  } else if (errno != ENOENT) {
    return loom_fail(err, LOOM_ERR_IO, "%s %s: %s", flag, path, strerror(errno));
  }
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  if (stat(dir, &sb) != 0) return loom_fail(err, LOOM_ERR_IO, "%s %s: %s: %s", flag, path, dir, strerror(errno));
  if (!S_ISDIR(sb.st_mode)) return loom_fail(err, LOOM_ERR_IO, "%s %s: %s is not a directory", flag, path, dir);
  return probe_dir(flag, path, dir, err);
}
