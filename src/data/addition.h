/* The synthetic addition task: lines like "042+317=9530\n" in byte tokens.
 *
 * Operands have `digits` digits (zero-padded); the sum is written with its
 * least significant digit first, padded to digits+1, which lets a left-to-
 * right model carry as it writes. A pair (a, b) belongs to the held-out split
 * iff a keyed hash of it is 0 mod 10, so held-out sums are never trained on.
 * Only the sum's digits and its newline are targets: the operands are
 * random, so predicting them teaches nothing. The loss falls from ln 256 as
 * the model learns the format, then the sums; exact-match accuracy on
 * held-out problems shows whether it learned to add. */
#ifndef LOOM_ADDITION_H
#define LOOM_ADDITION_H

#include <stdint.h>
#include "data/dataset.h"

#define LOOM_ADDITION_DEFAULT_DIGITS 2

/* A dataset of windows packed with whole problems (a window starts a line). */
loom_dataset *loom_dataset_addition(int digits, uint64_t seed);

/* The window position of a problem's first target (its sum's first digit):
 * a window of fewer tokens than this holds no target at all. */
int loom_addition_first_target(int digits);

/* Exact-match scoring of one window: problems whose whole answer lies in the
 * window, and how many of them had every answer digit predicted right.
 * predicted[t] is the model's argmax after reading window[0..t]. */
void loom_addition_score(const int *window, const int *predicted, int T, int digits,
                         int *problems, int *correct);

#endif
