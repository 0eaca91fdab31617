/* Opening files from outside for reading, with one clear line when the path
 * is missing, unreadable, or not a regular file (a directory, a device). */
#ifndef LOOM_READ_FILE_H
#define LOOM_READ_FILE_H

#include <stdio.h>
#include "core/status.h"

/* *fp gets path opened "rb"; what names the file's kind in errors ("model file"). */
loom_status loom_open_for_reading(const char *path, const char *what, FILE **fp, loom_error *err);
/* Reads a whole small file (at most max bytes, else refused naming the
 * limit) into a NUL-terminated buffer the caller frees; *len its bytes. */
loom_status loom_read_small_file(const char *path, const char *what, size_t max, char **out, size_t *len, loom_error *err);

#endif
