// The emulated GPU's NCCL, between emulated ranks over MPI. Every call is
// queued on its stream and starts when the stream reaches it (a receive a
// rank's GPU has not reached is not posted, so a send to it waits, as an
// NCCL send does). Point to point, a send is an MPI synchronous send
// (MPI_Issend): it completes only once the peer's receive has been posted
// and matched, and messages between two ranks match in issue order with
// one tag, as NCCL's do; a receive whose matched send has another size is
// an error, not a silent truncation. A collective is built from messages
// too, tagged with its place in the order ranks issue collectives on the
// communicator, so that collectives match by issue order whatever order the
// streams reach them in; reductions add the ranks' parts in rank order,
// so every rank gets the same bits. ncclGroupStart/End start their
// operations together, so that a group's sends and receives cannot wait on
// each other.
#define OMPI_SKIP_MPICXX 1 // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <functional>
#include <map>
#include <memory>
#include <vector>
#include "emu.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  uint64_t collectives = 0;            // issued so far: the next one's tag
  ncclResult_t async = ncclSuccess;    // ncclCommGetAsyncError's
  bool aborted = false;
};

namespace loom_emu {
namespace {

constexpr uint32_t ID_MAGIC = 0x4c454d55; // "LEMU"
struct IdContents {
  uint32_t magic;
  int creator;      // MPI_COMM_WORLD rank of the rank that made it
  uint64_t counter; // ids it made before this one
};

int tag_ub() {
  int *ub = nullptr, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  return flag && ub ? *ub : 32767;
}

// One NCCL call's messages: posted together when its stream reaches it,
// finished (the received values written to device memory) once all are done.
struct Part {
  ncclComm_t comm;
  const char *what;
  std::function<void(Part &)> start;
  std::function<void(Part &)> finish;
  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses; // the requests', once all are done
  std::vector<std::vector<char>> buffers;
  bool started = false;
  // Posts a message of `bytes` from or into buffer `b`.
  void post(bool send, int peer, size_t b, int tag, bool synchronous) {
    MPI_Request r;
    std::vector<char> &buf = buffers[b];
    if (send && synchronous) MPI_Issend(buf.data(), (int)buf.size(), MPI_BYTE, peer, tag, comm->mpi, &r);
    else if (send) MPI_Isend(buf.data(), (int)buf.size(), MPI_BYTE, peer, tag, comm->mpi, &r);
    else MPI_Irecv(buf.data(), (int)buf.size(), MPI_BYTE, peer, tag, comm->mpi, &r);
    requests.push_back(r);
  }
};

int g_group_depth;
std::vector<std::pair<cudaStream_t, std::shared_ptr<Part>>> g_grouped; // parts waiting for ncclGroupEnd

// Queues the parts of one stream as one piece of work.
void queue(cudaStream_t stream, std::vector<std::shared_ptr<Part>> parts) {
  enqueue(stream, parts.size() == 1 ? parts[0]->what : "an NCCL group", [parts] {
    for (const auto &p : parts)
      if (!p->started) {
        p->started = true;
        if (!p->comm->aborted) p->start(*p);
      }
    for (const auto &p : parts) {
      if (p->comm->aborted) continue;
      int done = 0;
      if (!p->requests.empty() && p->statuses.empty()) { // (a finished request's status is read once: it is spent)
        std::vector<MPI_Status> st(p->requests.size());
        if (MPI_Testall((int)p->requests.size(), p->requests.data(), &done, st.data()) != MPI_SUCCESS) {
          p->comm->async = ncclRemoteError;
          fault(cudaErrorLaunchFailure, "NCCL %s: a message between ranks failed", p->what);
          return true;
        }
        if (!done) return false;
        p->statuses = st;
      }
    }
    for (const auto &p : parts)
      if (!p->comm->aborted) p->finish(*p);
    return true;
  });
}

ncclResult_t submit(cudaStream_t stream, std::shared_ptr<Part> p) {
  if (g_group_depth > 0) g_grouped.emplace_back(stream, p);
  else queue(stream, {p});
  return ncclSuccess;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

uint16_t bf16_round(float x) { // round to nearest even, NaN kept a NaN: __float2bfloat16's
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
  return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}

template <typename T> T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
  case ncclProd: return a * b;
  case ncclMax: return a > b ? a : b;
  case ncclMin: return a < b ? a : b;
  default: return a + b;
  }
}

// acc[i] = acc[i] op x[i] for n elements of type t (bf16 widened, combined in fp32, rounded back).
void reduce_into(char *acc, const char *x, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  for (size_t i = 0; i < n; i++) switch (t) {
    case ncclFloat32: ((float *)acc)[i] = combine(((float *)acc)[i], ((const float *)x)[i], op); break;
    case ncclFloat64: ((double *)acc)[i] = combine(((double *)acc)[i], ((const double *)x)[i], op); break;
    case ncclInt32: ((int32_t *)acc)[i] = combine(((int32_t *)acc)[i], ((const int32_t *)x)[i], op); break;
    case ncclUint32: ((uint32_t *)acc)[i] = combine(((uint32_t *)acc)[i], ((const uint32_t *)x)[i], op); break;
    case ncclInt64: ((int64_t *)acc)[i] = combine(((int64_t *)acc)[i], ((const int64_t *)x)[i], op); break;
    case ncclUint64: ((uint64_t *)acc)[i] = combine(((uint64_t *)acc)[i], ((const uint64_t *)x)[i], op); break;
    case ncclInt8: ((int8_t *)acc)[i] = combine(((int8_t *)acc)[i], ((const int8_t *)x)[i], op); break;
    case ncclUint8: ((uint8_t *)acc)[i] = combine(((uint8_t *)acc)[i], ((const uint8_t *)x)[i], op); break;
    case ncclBfloat16:
      ((uint16_t *)acc)[i] = bf16_round(combine(bf16_value(((uint16_t *)acc)[i]), bf16_value(((const uint16_t *)x)[i]), op));
      break;
    default: break;
    }
}

// The checks every call makes; ncclSuccess or why not.
ncclResult_t check_call(const char *call, ncclComm_t comm, ncclDataType_t type, const void *p, size_t bytes) {
  if (!comm) {
    note("%s: a null communicator", call);
    return ncclInvalidArgument;
  }
  if (!type_size(type) || type == ncclFloat16) {
    note("%s: data type %d is not emulated", call, (int)type);
    return ncclInvalidArgument;
  }
  if (bytes && (space_of(p) == SPACE_HOST || !inside_allocation(p, bytes))) {
    char where[160];
    describe(p, where, sizeof where);
    note("%s: %zu bytes at %p are not device memory (%s): NCCL reads and writes the GPU's memory only", call, bytes, p,
         where);
    return ncclInvalidArgument;
  }
  if (bytes > (size_t)0x7fffffff) {
    note("%s: %zu bytes is more than the emulator moves in one message", call, bytes);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// check_call's checks, and a peer within the communicator.
ncclResult_t check_p2p(const char *call, ncclComm_t comm, ncclDataType_t type, const void *p, size_t bytes, int peer) {
  const ncclResult_t r = check_call(call, comm, type, p, bytes);
  if (r == ncclSuccess && (peer < 0 || peer >= comm->size)) {
    note("%s: peer %d of %d ranks", call, peer, comm->size);
    return ncclInvalidArgument;
  }
  return r;
}

int next_tag(ncclComm_t c) {
  static const int ub = tag_ub();
  return 1 + (int)(c->collectives++ % (uint64_t)(ub - 1));
}

std::shared_ptr<Part> part(ncclComm_t comm, const char *what, size_t buffers) {
  auto p = std::make_shared<Part>();
  p->comm = comm;
  p->what = what;
  p->buffers.resize(buffers);
  return p;
}

} // namespace
} // namespace loom_emu

using namespace loom_emu;

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  static uint64_t made;
  IdContents c{ID_MAGIC, 0, made++};
  MPI_Comm_rank(MPI_COMM_WORLD, &c.creator);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &c, sizeof c);
  return ncclSuccess;
}

// The ranks meet at the id's creator over MPI_COMM_WORLD, which sends every
// rank the world ranks of the others; they then make an MPI communicator of
// exactly those ranks (MPI_Comm_create_group involves no one else).
ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  LOOM_EMU_LOCK;
  IdContents c;
  memcpy(&c, id.internal, sizeof c);
  if (!out || nranks < 1 || rank < 0 || rank >= nranks || c.magic != ID_MAGIC) {
    note("ncclCommInitRank: rank %d of %d with %s id", rank, nranks, c.magic == ID_MAGIC ? "an" : "a malformed");
    return ncclInvalidArgument;
  }
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  const int tag = tag_ub() - 1 - (int)(c.counter % 4096);
  std::vector<int> ranks((size_t)nranks, -1);
  ranks[(size_t)rank] = world;
  if (nranks > 1 && world == c.creator) {
    for (int i = 1; i < nranks; i++) {
      int pair[2];
      MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (pair[0] < 0 || pair[0] >= nranks || ranks[(size_t)pair[0]] >= 0) {
        note("ncclCommInitRank: two ranks claim rank %d of %d", pair[0], nranks);
        return ncclInvalidUsage;
      }
      ranks[(size_t)pair[0]] = pair[1];
    }
    for (int i = 0; i < nranks; i++)
      if (i != rank) MPI_Send(ranks.data(), nranks, MPI_INT, ranks[(size_t)i], tag, MPI_COMM_WORLD);
  } else if (nranks > 1) {
    int pair[2] = {rank, world};
    MPI_Send(pair, 2, MPI_INT, c.creator, tag, MPI_COMM_WORLD);
    MPI_Recv(ranks.data(), nranks, MPI_INT, c.creator, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group all, members;
  MPI_Comm_group(MPI_COMM_WORLD, &all);
  MPI_Group_incl(all, nranks, ranks.data(), &members);
  ncclComm *comm = new ncclComm;
  const int made = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &comm->mpi);
  MPI_Group_free(&members);
  MPI_Group_free(&all);
  if (made != MPI_SUCCESS || comm->mpi == MPI_COMM_NULL) {
    delete comm;
    return ncclSystemError;
  }
  MPI_Comm_set_errhandler(comm->mpi, MPI_ERRORS_RETURN);
  comm->rank = rank;
  comm->size = nranks;
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  LOOM_EMU_LOCK;
  if (!comm) return ncclInvalidArgument;
  MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Work queued on an aborted communicator ends without moving anything.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  LOOM_EMU_LOCK;
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  LOOM_EMU_LOCK;
  if (g_group_depth == 0) {
    note("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--g_group_depth > 0) return ncclSuccess;
  // One piece of work per stream, its parts in call order.
  std::vector<std::pair<cudaStream_t, std::vector<std::shared_ptr<Part>>>> by_stream;
  for (auto &[stream, p] : g_grouped) {
    size_t i = 0;
    while (i < by_stream.size() && by_stream[i].first != stream) i++;
    if (i == by_stream.size()) by_stream.push_back({stream, {}});
    by_stream[i].second.push_back(p);
  }
  g_grouped.clear();
  for (auto &[stream, parts] : by_stream) queue(stream, parts);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  LOOM_EMU_LOCK;
  const size_t bytes = count * type_size(type);
  ncclResult_t r = check_call("ncclAllReduce", comm, type, send, bytes);
  if (r == ncclSuccess) r = check_call("ncclAllReduce", comm, type, recv, bytes);
  if (r != ncclSuccess) return r;
  if (op == ncclAvg) {
    note("ncclAllReduce: ncclAvg is not emulated");
    return ncclInvalidArgument;
  }
  const int tag = next_tag(comm), n = comm->size, me = comm->rank;
  auto p = part(comm, "all-reduce", (size_t)n + 1);
  p->start = [=](Part &p) { // buffers[r]: rank r's values; [n]: mine, sent to every other rank
    p.buffers[(size_t)n].assign((const char *)send, (const char *)send + bytes);
    for (int q = 0; q < n; q++) {
      if (q == me) continue;
      p.buffers[(size_t)q].resize(bytes);
      p.post(false, q, (size_t)q, tag, false);
    }
    for (int q = 0; q < n; q++)
      if (q != me) p.post(true, q, (size_t)n, tag, false);
  };
  p->finish = [=](Part &p) {
    std::vector<char> acc(p.buffers[me == 0 ? (size_t)n : 0]);
    for (int q = 1; q < n; q++) reduce_into(acc.data(), p.buffers[q == me ? (size_t)n : (size_t)q].data(), count, type, op);
    memcpy(recv, acc.data(), bytes);
  };
  return submit(stream, p);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  LOOM_EMU_LOCK;
  const size_t bytes = count * type_size(type);
  ncclResult_t r = check_call("ncclBroadcast", comm, type, recv, bytes);
  if (r == ncclSuccess && comm->rank == root) r = check_call("ncclBroadcast", comm, type, send, bytes);
  if (r != ncclSuccess) return r;
  if (root < 0 || root >= comm->size) {
    note("ncclBroadcast: root %d of %d ranks", root, comm->size);
    return ncclInvalidArgument;
  }
  const int tag = next_tag(comm), n = comm->size, me = comm->rank;
  auto p = part(comm, "broadcast", 1);
  p->start = [=](Part &p) {
    if (me == root) {
      p.buffers[0].assign((const char *)send, (const char *)send + bytes);
      for (int q = 0; q < n; q++)
        if (q != me) p.post(true, q, 0, tag, false);
    } else {
      p.buffers[0].resize(bytes);
      p.post(false, root, 0, tag, false);
    }
  };
  p->finish = [=](Part &p) { memcpy(recv, p.buffers[0].data(), bytes); };
  return submit(stream, p);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  LOOM_EMU_LOCK;
  const size_t bytes = send_count * type_size(type);
  ncclResult_t r = check_call("ncclAllGather", comm, type, send, bytes);
  if (r == ncclSuccess) r = check_call("ncclAllGather", comm, type, recv, bytes * (size_t)comm->size);
  if (r != ncclSuccess) return r;
  const int tag = next_tag(comm), n = comm->size, me = comm->rank;
  auto p = part(comm, "all-gather", (size_t)n);
  p->start = [=](Part &p) { // buffers[r]: rank r's piece
    p.buffers[(size_t)me].assign((const char *)send, (const char *)send + bytes);
    for (int q = 0; q < n; q++)
      if (q != me) p.buffers[(size_t)q].resize(bytes), p.post(false, q, (size_t)q, tag, false);
    for (int q = 0; q < n; q++)
      if (q != me) p.post(true, q, (size_t)me, tag, false);
  };
  p->finish = [=](Part &p) {
    for (int q = 0; q < n; q++) memcpy((char *)recv + (size_t)q * bytes, p.buffers[(size_t)q].data(), bytes);
  };
  return submit(stream, p);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  LOOM_EMU_LOCK;
  const size_t bytes = recv_count * type_size(type);
  ncclResult_t r = check_call("ncclReduceScatter", comm, type, send, bytes * (size_t)comm->size);
  if (r == ncclSuccess) r = check_call("ncclReduceScatter", comm, type, recv, bytes);
  if (r != ncclSuccess) return r;
  const int tag = next_tag(comm), n = comm->size, me = comm->rank;
  auto p = part(comm, "reduce-scatter", 2 * (size_t)n);
  p->start = [=](Part &p) { // buffers[r]: rank r's piece of my chunk; [n + q]: my piece of q's chunk
    for (int q = 0; q < n; q++) {
      const char *mine = (const char *)send + (size_t)q * bytes;
      p.buffers[(size_t)(n + q)].assign(mine, mine + bytes);
    }
    p.buffers[(size_t)me] = p.buffers[(size_t)(n + me)];
    for (int q = 0; q < n; q++)
      if (q != me) p.buffers[(size_t)q].resize(bytes), p.post(false, q, (size_t)q, tag, false);
    for (int q = 0; q < n; q++)
      if (q != me) p.post(true, q, (size_t)(n + q), tag, false);
  };
  p->finish = [=](Part &p) {
    std::vector<char> acc(p.buffers[0]);
    for (int q = 1; q < n; q++) reduce_into(acc.data(), p.buffers[(size_t)q].data(), recv_count, type, op);
    memcpy(recv, acc.data(), bytes);
  };
  return submit(stream, p);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  LOOM_EMU_LOCK;
  const size_t bytes = count * type_size(type);
  const ncclResult_t r = check_p2p("ncclSend", comm, type, send, bytes, peer);
  if (r != ncclSuccess) return r;
  if (!count) return ncclSuccess; // NCCL moves nothing and matches nothing
  auto p = part(comm, "send", 1);
  p->start = [=](Part &p) {
    p.buffers[0].assign((const char *)send, (const char *)send + bytes);
    p.post(true, peer, 0, 0, true); // synchronous: done only once the peer's receive matched it
  };
  p->finish = [](Part &) {};
  return submit(stream, p);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  LOOM_EMU_LOCK;
  const size_t bytes = count * type_size(type);
  const ncclResult_t r = check_p2p("ncclRecv", comm, type, recv, bytes, peer);
  if (r != ncclSuccess) return r;
  if (!count) return ncclSuccess;
  auto p = part(comm, "recv", 1);
  // One byte more than expected, so that a longer send shows as one rather than as a truncation error.
  p->start = [=](Part &p) {
    p.buffers[0].resize(bytes + 1);
    MPI_Request q;
    MPI_Irecv(p.buffers[0].data(), (int)bytes + 1, MPI_BYTE, peer, 0, comm->mpi, &q);
    p.requests.push_back(q);
  };
  p->finish = [=](Part &p) {
    int got = 0;
    MPI_Get_count(&p.statuses[0], MPI_BYTE, &got);
    if ((size_t)got != bytes) {
      comm->async = ncclInvalidUsage;
      fault(cudaErrorLaunchFailure,
            "NCCL recv of %zu bytes from rank %d matched a send of %d%s bytes: sends and receives between two ranks "
            "match in the order each rank issues them",
            bytes, peer, got > (int)bytes ? (int)bytes + 1 : got, got > (int)bytes ? " or more" : "");
      return;
    }
    memcpy(recv, p.buffers[0].data(), bytes);
  };
  return submit(stream, p);
}

} // extern "C"
