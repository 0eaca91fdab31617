/* The collective watchdog's NCCL side. NCCL calls only queue work on
 * streams, so a hang shows where the host waits for a stream: every such
 * wait (the CUDA backend's, through loom_cuda_set_host_wait, and the NCCL
 * backend's own) polls the stream and, now and then, ncclCommGetAsyncError
 * on every live communicator. An NCCL error ends the job with one line
 * naming it and its group; a wait past --watchdog-timeout runs the MPI
 * watchdog's survey (comm/mpi/watchdog.h: the same one-line message naming
 * the stalled ranks). Either way every communicator is aborted with
 * ncclCommAbort first, so no kernel is left spinning on the GPU. */
#ifndef LOOM_NCCL_WATCHDOG_H
#define LOOM_NCCL_WATCHDOG_H

/* Communicators (ncclComm_t) to poll for errors and abort; `group` names
 * it (kept, not copied: the group's name, valid until loom_nccl_forget). */
void loom_nccl_watch(void *comm, const char *group);
void loom_nccl_forget(void *comm);
/* The operation last handed to NCCL, named in a timeout's message. */
void loom_nccl_issued(const char *op, const char *group);
/* Ends the job from this rank with one line, every communicator aborted
 * first (ncclCommAbort), so no peer's kernel is left waiting on this one. */
void loom_nccl_fail(const char *line);
/* Waits on the host for everything queued on `stream` (a cudaStream_t), under the watchdog. */
void loom_nccl_wait_stream(void *stream, const char *what);

#endif
