/* The byte-level tokenizer: token i is byte i, vocab 256. */
#ifndef LOOM_BYTE_TOKENIZER_H
#define LOOM_BYTE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "core/status.h"

#define LOOM_BYTE_VOCAB 256

/* Writes token t as its byte, escaping non-printable bytes as \xNN. */
void loom_byte_print(FILE *fp, int token);

#endif
