/* TensorBoard event files (see tensorboard.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/crc32c.h"
#include "core/log.h"
#include "pipeline/tensorboard.h"
#include "tensorboard.pb-c.h"

struct loom_tensorboard {
  FILE *fp;
  char path[4300];
  int failed_errno; /* the write that failed (0: none); nothing is written after it */
};

uint32_t loom_tensorboard_masked_crc(const void *data, size_t n) {
  const uint32_t crc = loom_crc32c(0, data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

/* One record: the framing around the packed event, flushed. */
static void write_event(loom_tensorboard *tb, const Loom__Tb__Event *event) {
  if (!tb->fp) return;
  const size_t n = loom__tb__event__get_packed_size(event);
  uint8_t *data = malloc(n ? n : 1), head[12], tail[4];
  if (!data) {
    errno = ENOMEM;
  } else {
    loom__tb__event__pack(event, data);
    put_le(head, n, 8);
    put_le(head + 8, loom_tensorboard_masked_crc(head, 8), 4);
    put_le(tail, loom_tensorboard_masked_crc(data, n), 4);
    errno = 0;
    if (fwrite(head, 1, 12, tb->fp) == 12 && fwrite(data, 1, n, tb->fp) == n && fwrite(tail, 1, 4, tb->fp) == 4 &&
        fflush(tb->fp) == 0) {
      free(data);
      return;
    }
  }
  free(data);
  tb->failed_errno = errno ? errno : EIO;
  fclose(tb->fp);
  tb->fp = NULL;
  loom_log_error("--tensorboard-dir: writing %s failed (%s); TensorBoard stops recording here, training goes on", tb->path,
                 strerror(tb->failed_errno));
}

static double wall_time(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* An event stamped now, at `step` (< 0: none, as the file version's). */
static Loom__Tb__Event event_at(int64_t step) {
  Loom__Tb__Event e = LOOM__TB__EVENT__INIT;
  e.has_wall_time = 1, e.wall_time = wall_time();
  e.has_step = step >= 0, e.step = step >= 0 ? step : 0;
  return e;
}

loom_status loom_tensorboard_open(loom_tensorboard **out, const char *dir, int64_t first_step, loom_error *err) {
  *out = NULL;
  struct stat sb;
  if (mkdir(dir, 0755) != 0 && !(errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)))
    return loom_fail(err, LOOM_ERR_IO, "--tensorboard-dir %s: cannot make the directory: %s", dir,
                     errno == EEXIST ? "a file is in the way" : strerror(errno));
  loom_tensorboard *tb = calloc(1, sizeof *tb);
  if (!tb) return loom_fail(err, LOOM_ERR_NOMEM, "--tensorboard-dir: out of memory");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s.%ld.0", dir, (long)time(NULL), host, (long)getpid());
  tb->fp = fopen(tb->path, "wbx"); /* a new file: never one of an earlier run, however fast the restart */
  if (!tb->fp) {
    const int why = errno;
    free(tb);
    return loom_fail(err, LOOM_ERR_IO, "--tensorboard-dir %s: cannot create an event file: %s", dir, strerror(why));
  }
  Loom__Tb__Event e = event_at(-1);
  e.file_version = "brain.Event:2";
  write_event(tb, &e);
  if (first_step > 0) {
    Loom__Tb__SessionLog restart = LOOM__TB__SESSION_LOG__INIT;
    restart.has_status = 1, restart.status = LOOM__TB__SESSION_LOG__SESSION_STATUS__START;
    Loom__Tb__Event r = event_at(first_step);
    r.session_log = &restart;
    write_event(tb, &r);
  }
  *out = tb;
  return LOOM_OK;
}

void loom_tensorboard_scalar(loom_tensorboard *tb, const char *tag, int64_t step, double value) {
  if (!tb || !tb->fp) return;
  Loom__Tb__Summary__Value v = LOOM__TB__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.has_simple_value = 1, v.simple_value = (float)value;
  Loom__Tb__Summary__Value *values[1] = {&v};
  Loom__Tb__Summary s = LOOM__TB__SUMMARY__INIT;
  s.n_value = 1, s.value = values;
  Loom__Tb__Event e = event_at(step);
  e.summary = &s;
  write_event(tb, &e);
}

loom_status loom_tensorboard_close(loom_tensorboard *tb, loom_error *err) {
  if (!tb) return LOOM_OK;
  if (tb->fp && fclose(tb->fp) != 0 && !tb->failed_errno) tb->failed_errno = errno ? errno : EIO;
  const int failed = tb->failed_errno;
  char path[sizeof tb->path];
  snprintf(path, sizeof path, "%s", tb->path);
  free(tb);
  if (!failed) return LOOM_OK;
  return loom_fail(err, LOOM_ERR_WRITE, "--tensorboard-dir: %s stopped recording (%s); the run itself went on to its end",
                   path, strerror(failed));
}
