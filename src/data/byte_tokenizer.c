/* Byte tokenizer: tokens back to text. */
#include "data/byte_tokenizer.h"

void loom_byte_print(FILE *fp, int token) {
  if (token == '\n' || token == '\t' || (token >= 32 && token < 127)) fputc(token, fp);
  else fprintf(fp, "\\x%02x", token & 0xff);
}
