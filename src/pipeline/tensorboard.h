/* --tensorboard-dir DIR: TensorBoard event files. Each record is TFRecord's
 * framing (the length as 8 bytes little-endian and its masked CRC-32C, the
 * data, the data's masked CRC-32C) around one Event protobuf
 * (proto/tensorboard.proto): first the file version, then one scalar per
 * record, under the names Megatron-LM uses. A run writes a file of its own,
 * events.out.tfevents.TIME.HOST.PID.0 as PyTorch's SummaryWriter names them;
 * a resumed run starts its file with a SessionLog START at its first step,
 * so TensorBoard drops the earlier run's values from that step on. */
#ifndef LOOM_TENSORBOARD_H
#define LOOM_TENSORBOARD_H

#include <stdint.h>
#include "core/status.h"

typedef struct loom_tensorboard loom_tensorboard;

/* Makes dir if absent and opens a new event file in it; first_step > 0
 * marks a restart at that step. */
loom_status loom_tensorboard_open(loom_tensorboard **tb, const char *dir, int64_t first_step, loom_error *err);
/* Appends one scalar. A failed write is logged once and ends the file's
 * recording (loom_tensorboard_close then reports it). */
void loom_tensorboard_scalar(loom_tensorboard *tb, const char *tag, int64_t step, double value);
/* Closes the file (NULL: nothing); an error if a write failed at any point. */
loom_status loom_tensorboard_close(loom_tensorboard *tb, loom_error *err);

/* The masked CRC-32C of TFRecord's framing: the CRC rotated right by 15
 * bits plus 0xa282ead8. */
uint32_t loom_tensorboard_masked_crc(const void *data, size_t n);

#endif
