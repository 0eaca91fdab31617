/* Temp-file-and-rename writer. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
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

/* path made absolute and canonical as far as it exists: realpath of the
 * longest existing prefix, the rest appended with "." and ".." resolved. */
static void canonical_path(const char *path, char *out, size_t n) {
  char joined[8192], head[8192];
  if (path[0] == '/') snprintf(joined, sizeof joined, "%s", path);
  else {
    char cwd[4096];
    snprintf(joined, sizeof joined, "%s/%s", getcwd(cwd, sizeof cwd) ? cwd : ".", path);
  }
  /* The longest prefix (at a '/') that exists, resolved by realpath. */
  size_t cut = strlen(joined);
  for (;;) {
    snprintf(head, sizeof head, "%.*s", (int)cut, joined);
    char resolved[PATH_MAX];
    if (cut == 0 || realpath(head, resolved)) {
      snprintf(out, n, "%s", cut == 0 || strcmp(resolved, "/") == 0 ? "" : resolved);
      break;
    }
    while (cut > 0 && joined[cut - 1] != '/') cut--;
    while (cut > 0 && joined[cut - 1] == '/') cut--;
  }
  /* The rest, word by word. */
  for (char *word = strtok(joined + cut, "/"); word; word = strtok(NULL, "/")) {
    if (strcmp(word, ".") == 0) continue;
    if (strcmp(word, "..") == 0) {
      char *slash = strrchr(out, '/');
      if (slash) *slash = '\0';
      continue;
    }
    const size_t len = strlen(out);
    snprintf(out + len, n - len, "/%s", word);
  }
  if (!*out) snprintf(out, n, "/");
}

/* Whether canonical path a lies inside directory b (or is b). */
static bool path_within(const char *a, const char *b) {
  const size_t len = strlen(b);
  return strncmp(a, b, len) == 0 && (a[len] == '\0' || a[len] == '/' || (len == 1 && b[0] == '/'));
}

loom_status loom_paths_distinct(const char *cmd, const loom_path_use *uses, int n, loom_error *err) {
  /* Each path canonical once; "" for one not given, or a device such as /dev/null, which takes any number of outputs. */
  char (*canon)[4096] = calloc((size_t)n + 1, sizeof *canon);
  if (!canon) return loom_fail(err, LOOM_ERR_NOMEM, "%s: out of memory checking its paths", cmd);
  struct stat sb;
  for (int i = 0; i < n; i++)
    if (uses[i].path && *uses[i].path && !(stat(uses[i].path, &sb) == 0 && S_ISCHR(sb.st_mode)))
      canonical_path(uses[i].path, canon[i], sizeof canon[i]);
  loom_status st = LOOM_OK;
  for (int i = 0; i < n && st == LOOM_OK; i++)
    for (int j = 0; j < n && st == LOOM_OK && canon[i][0]; j++) {
      if (j == i || !canon[j][0]) continue;
      const bool same = strcmp(canon[i], canon[j]) == 0;
      const bool read_only = uses[i].role == LOOM_PATH_INPUT && uses[j].role == LOOM_PATH_INPUT;
      if (j > i && same && !read_only)
        st = loom_fail(err, LOOM_ERR_USAGE, "%s: %s and %s both name %s: one path, one %s", cmd, uses[i].flag, uses[j].flag,
                       uses[i].path, uses[i].role == LOOM_PATH_INPUT || uses[j].role == LOOM_PATH_INPUT
                                         ? "use (an output would overwrite what the run reads)" : "output");
      else if (uses[j].role == LOOM_PATH_REPLACED && !same && path_within(canon[i], canon[j]))
        st = loom_fail(err, LOOM_ERR_USAGE, "%s: %s %s lies inside %s %s, which is replaced whole when it is written",
                       cmd, uses[i].flag, uses[i].path, uses[j].flag, uses[j].path);
    }
  free(canon);
  return st;
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
