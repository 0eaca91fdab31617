/* Point-to-point transfers between pipeline stages: activations up, grads
 * down, each message one micro-batch's boundary activation
 * (loom_gpt_boundary_floats values), sent as fp32 or, in bf16 runs, as bf16
 * (loom_gpt_boundary_words): packed into the send buffer on the way out,
 * received into a staging buffer and widened into place (both exact: the
 * values are bf16 ones).
 *
 * An outgoing message is copied into a send buffer of its own, so a slot is
 * never held by a send: with large messages MPI completes a send only once
 * its recv is posted, and waiting for that before reusing a slot could
 * stall the pipeline. Which buffer a send holds, and when it is given back
 * (its send waited for), are the schedule's buffer events.
 *
 * Messages travel on channels, as the verifier proves schedules under
 * rendezvous sends (LOOM_SENDS_RENDEZVOUS): a two-rank group for each
 * ordered pair of ranks and kind of message (activations, grads), split
 * from the pipeline group, each transfer handed to the network as it is
 * made. Over NCCL each channel end is a stream of its own, so a send waiting
 * for its recv holds up nothing else, and the two kinds never meet each
 * other's recvs. A message between two chunks of one rank is copied from
 * its send buffer when received, never sent. */
#ifndef LOOM_P2P_H
#define LOOM_P2P_H

#include <stdbool.h>
#include "backend/ops.h"
#include "comm/comm.h"
#include "core/tensor.h"
#include "pipeline/buffer_pool.h"

typedef struct {
  loom_comm *group;          /* the pipeline group */
  loom_comm **to, **from;    /* [2 * p] the channels to and from each pipeline rank, by kind (grad * p + rank); NULL: none */
  bool v_shape;              /* stages lie as a V (where a message to this rank comes from) */
  const loom_ops *ops;       /* the backend: its memory holds the buffers, its casts pack bf16 messages */
  size_t floats;             /* values of one message */
  bool bf16;                 /* messages travel as bf16 */
  size_t words;              /* 32-bit words of one message */
  uint16_t *staging;         /* bf16 with stages to receive from: where a message lands before it is widened */
  int v, p;                  /* chunks per rank, pipeline ranks (tags) */
  int m;                     /* micro-batches the map has room for */
  int n;                     /* send buffers */
  float **buf;               /* [n] */
  loom_request **req;        /* [n] the send from each buffer, NULL once waited for (or copied on the rank) */
  bool *sent;                /* [n] the buffer holds a message sent, not yet given back */
  loom_buffer_pool pool;     /* which send holds which buffer */
  int64_t bytes_sent;        /* to other ranks, counted as they leave: the measured traffic */
} loom_p2p;

/* n send buffers of `floats` values each (fp32, or bf16 when bf16), for m
 * micro-batches over v chunks laid out looped or as a V; and the channels
 * between the stages, split from the pipeline group (collective over it). */
loom_status loom_p2p_init(loom_p2p *x, loom_comm *group, const loom_ops *ops, size_t floats, bool bf16, int p, int v,
                          bool v_shape, int m, int n);
/* Room in the map for m micro-batches (an evaluation's schedule); the buffers stay as they are. */
void loom_p2p_widen(loom_p2p *x, int m);
void loom_p2p_free(loom_p2p *x);
/* Every buffer free: at a schedule's start. */
void loom_p2p_reset(loom_p2p *x);
/* The tag of a message by its destination stage: both ends agree. Between
 * two ranks the destination's chunk fixes the stage, so (micro-batch, chunk,
 * kind) name it: m x v x 2 tags, which the plan's rules keep within MPI's
 * guaranteed 32767. */
int loom_p2p_tag(const loom_p2p *x, int mb, int dst_stage, bool grad);
/* The buffer events of a send (grad or activation, this rank's chunk, mb):
 * take its buffer, and give it back once its send is done. */
void loom_p2p_acquire(loom_p2p *x, bool grad, int chunk, int mb);
void loom_p2p_release(loom_p2p *x, bool grad, int chunk, int mb);
/* Copies data into the send's buffer and starts sending it. */
void loom_p2p_send(loom_p2p *x, bool grad, int chunk, int mb, const float *data, int peer, int dst_stage);
/* Receives the message for dst_stage (this rank's) into dst. */
void loom_p2p_recv(loom_p2p *x, bool grad, int mb, int dst_stage, float *dst, int peer);

#endif
