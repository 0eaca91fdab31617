/* Opening files from outside for reading, with one clear line when the path
 * is missing, unreadable, or not a regular file (a directory, a device). */
#ifndef LOOM_READ_FILE_H
#define LOOM_READ_FILE_H

#include <stdio.h>
#include "core/status.h"

/* Why an open, stat or create failed, in a user's words where strerror's
 * mislead ("Permission denied" reads as a missing file to many; ELOOP's
 * "Too many levels of symbolic links" hides a loop). */
const char *loom_errno_words(int e);
/* fd gets path opened read-only, refused without blocking unless it is a
 * regular file (a FIFO, a device, a directory); what names the file's kind
 * in errors ("model file"), which say "permission denied" and name a
 * symbolic-link loop plainly. Every input loom reads opens through here. */
loom_status loom_open_regular(const char *path, const char *what, int *fd, loom_error *err);
/* *fp gets path opened "rb", as loom_open_regular. */
loom_status loom_open_for_reading(const char *path, const char *what, FILE **fp, loom_error *err);
/* Reads a whole small file (at most max bytes, else refused naming the
 * limit) into a NUL-terminated buffer the caller frees; *len its bytes. */
loom_status loom_read_small_file(const char *path, const char *what, size_t max, char **out, size_t *len, loom_error *err);

#endif
