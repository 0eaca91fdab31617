/* The name of every buffer a training run allocates: the runtime tells the
 * allocator these names, and the memory model's buffer list (plan/memory.h)
 * carries the same ones, so a recording allocator can check the list row by
 * row. One list, here, below every module that allocates (the layers, the
 * optimizers, ZeRO's runtime, p2p). */
#ifndef LOOM_RUN_BUFFERS_H
#define LOOM_RUN_BUFFERS_H

#define LOOM_RUN_BUFFERS(X)                                                              \
  X(PARAMS, "parameters")                 /* fp32 weights (the master beside bf16) */    \
  X(GRADS, "grads")                       /* fp32 grads */                               \
  X(COMPUTE, "bf16 weights")              /* the bf16 copy the layers compute with */    \
  X(SLOT, "activation slot")              /* a micro-batch's fp32 activations */         \
  X(SLOT_BF16, "activation slot bf16")    /* and its bf16 ones */                        \
  X(SLOT_TOKENS, "slot tokens")           /* its tokens, targets and predictions */      \
  X(WORK, "layer scratch")                /* the chunk's shared fp32 scratch */          \
  X(WORK_BF16, "layer scratch bf16")                                                     \
  X(WSTATE, "weight-grad state")          /* a split backward's state from B to W */     \
  X(WSTATE_BF16, "weight-grad state bf16")                                               \
  X(ADAM_M, "Adam m")                                                                    \
  X(ADAM_V, "Adam v")                                                                    \
  X(ZERO_MASTER, "ZeRO master piece")     /* fp32 weights' piece where none is whole */  \
  X(ZERO_GRAD, "ZeRO grad piece")         /* ZeRO-2/3's summed grads' piece */           \
  X(ZERO_SLICE, "ZeRO slice")             /* a bucket's slice in transit */              \
  X(ZERO_STAGING, "ZeRO staging")         /* pieces the experts' group reorders */      \
  X(ZERO_LAYER_GRADS, "ZeRO layer grads") /* ZeRO-2/3: a layer's grads in flight */      \
  X(ZERO_LAYER_PIECE, "ZeRO layer piece") /* and their summed piece */                   \
  X(ZERO_EDGE_GRADS, "ZeRO edge grads")   /* the edges' (embedding, head) grads */       \
  X(ZERO_EDGE_PIECE, "ZeRO edge piece")                                                  \
  X(ZERO_LAYER_GRADS_BF16, "ZeRO layer grads bf16") /* grad_reduce bf16: as they cross */ \
  X(ZERO_LAYER_PIECE_BF16, "ZeRO layer piece bf16")                                      \
  X(ZERO_EDGE_GRADS_BF16, "ZeRO edge grads bf16")                                        \
  X(ZERO_EDGE_PIECE_BF16, "ZeRO edge piece bf16")                                        \
  X(ZERO_LAYER_WEIGHTS, "ZeRO layer weights") /* ZeRO-3: a layer's gathered weights */   \
  X(ZERO_LAYER_SEND, "ZeRO layer send")       /* and the piece it sends */               \
  X(ZERO_EDGE_WEIGHTS, "ZeRO edge weights")                                              \
  X(SEND, "send buffer")                  /* a pipeline message in flight */             \
  X(RECEIVE, "receive buffer")            /* bf16 messages' staging */                   \
  X(DOUT, "received grad")                /* the output grad a stage receives, fp32 */   \
  X(GRAD_BF16, "bf16 grads for dp")       /* grads as they cross dp (grad_reduce bf16) */ \
  X(COMPRESS_ERROR, "compression error")  /* grad compression's error feedback */        \
  X(COMPRESS_A, "compression message")    /* PowerSGD's P, or the sign message */       \
  X(COMPRESS_B, "compression factors")    /* PowerSGD's Q, or every replica's messages */

typedef enum {
#define LOOM_RUN_BUFFER_ENUM(id, name) LOOM_BUF_##id,
  LOOM_RUN_BUFFERS(LOOM_RUN_BUFFER_ENUM)
#undef LOOM_RUN_BUFFER_ENUM
  LOOM_BUF_NAMES
} loom_run_buffer;

/* The name the allocator hears for buffer b. */
static inline const char *loom_run_buffer_name(loom_run_buffer b) {
  static const char *const NAMES[LOOM_BUF_NAMES] = {
#define LOOM_RUN_BUFFER_NAME(id, name) name,
      LOOM_RUN_BUFFERS(LOOM_RUN_BUFFER_NAME)
#undef LOOM_RUN_BUFFER_NAME
  };
  return b >= 0 && b < LOOM_BUF_NAMES ? NAMES[b] : "unnamed";
}

#endif
