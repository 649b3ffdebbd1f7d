// Collective communication between ranks, behind one interface: ranks as
// threads of one process (unit tests), ranks as processes over Gloo (CPU
// runs, local or under SLURM), and later NCCL (the CUDA backend).
//
// Every call is collective over the communicator's group and returns "" or
// one error line that names this rank, the operation, the group and, when it
// is known, the rank that failed or never arrived, e.g.
//   "rank 2: all_reduce on group 'tp' (4 ranks) timed out after 30 s: rank 3
//    never arrived (it died or is stuck); see its log"
// A communicator never hangs forever: every wait is bounded by the timeout
// it was created with. Ranks in error lines are world ranks, in every group.
#ifndef MT_RUNTIME_COLLECTIVES_H
#define MT_RUNTIME_COLLECTIVES_H

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace mt::rt {

enum class ReduceOp { Sum, Max };

struct RecordTarget; // collective_record.h

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;          // within this group
  virtual int size() const = 0;
  virtual const std::string &name() const = 0; // "world", "tp", "dp", ...

  // In place over `count` floats of every rank.
  virtual std::string all_reduce(float *data, size_t count, ReduceOp op) = 0;
  // out holds size() * count floats: rank r's `in` at out + r * count.
  virtual std::string all_gather(const float *in, size_t count, float *out) = 0;
  // in holds size() * count floats; rank r receives the sum of every rank's
  // block r in `out` (count floats).
  virtual std::string reduce_scatter(const float *in, size_t count, float *out) = 0;
  virtual std::string broadcast(float *data, size_t count, int root) = 0;
  // Point to point (pipeline stages); `tag` tells messages between the same
  // pair apart, and messages with the same tag arrive in the order sent. A
  // send completes when the peer has the bytes or they are buffered (both
  // backends buffer); recv blocks until they arrive or the timeout passes.
  // Buffered sends are flushed by barrier() and by the destructor, so a
  // process finishes with one of them before it exits.
  virtual std::string send(const void *data, size_t bytes, int peer, int tag) = 0;
  virtual std::string recv(void *data, size_t bytes, int peer, int tag) = 0;
  virtual std::string barrier() = 0;

  // All-to-all with per-peer sizes (MPI_Alltoallv; NCCL: grouped sends and
  // receives): this rank sends send_counts[p] elements of `elem_bytes` bytes
  // each, starting send_displs[p] elements into `send`, to group rank p, and
  // receives recv_counts[p] elements from p at recv_displs[p] elements into
  // `recv` (its own block is copied). Each vector has size() entries; counts
  // may be zero; the receive blocks must not overlap each other or `send`.
  // Rank p's send_counts[r] must equal rank r's recv_counts[p]: a mismatch
  // anywhere gives every member the same error line naming the pair.
  std::string all_to_all_v(const void *send, const std::vector<size_t> &send_counts,
                           const std::vector<size_t> &send_displs, void *recv,
                           const std::vector<size_t> &recv_counts,
                           const std::vector<size_t> &recv_displs, size_t elem_bytes) {
    return exchange_v("all_to_all_v", send, send_counts, send_displs, recv, recv_counts,
                      recv_displs, elem_bytes);
  }
  std::string all_to_all_v(const float *send, const std::vector<size_t> &send_counts,
                           const std::vector<size_t> &send_displs, float *recv,
                           const std::vector<size_t> &recv_counts,
                           const std::vector<size_t> &recv_displs) {
    return all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                        sizeof(float));
  }
  // all_gather with a size per rank (Megatron's gather with
  // output_split_sizes): `in` holds counts[rank()] floats, `out` the blocks
  // of every rank in rank order (counts[r] floats each, back to back).
  std::string all_gather_v(const float *in, const std::vector<size_t> &counts, float *out);
  // reduce_scatter with a size per rank (Megatron's reduce-scatter with
  // input_split_sizes): `in` holds the blocks of every rank in rank order
  // (counts[r] floats each); rank r gets the sum of every rank's block r in
  // `out`, added in rank order (the same bits on every backend's rank).
  std::string reduce_scatter_v(const float *in, const std::vector<size_t> &counts, float *out);

  // A sub-group of this group's ranks (`ranks` in this group's numbering,
  // ascending, including this rank); every member calls split with the same
  // list and name. Returns null and sets *error on failure.
  virtual std::unique_ptr<Communicator> split(const std::vector<int> &ranks,
                                              const std::string &name,
                                              std::string *error) = 0;

  // This process's collective record (collective_record.h), for the
  // collectives that run elsewhere (a GPU's, over NCCL) to be recorded
  // beside this communicator's and judged by the same timeout; false where
  // there is none (ranks as threads).
  virtual bool record_target(RecordTarget *out) const {
    (void)out;
    return false;
  }

protected:
  // What the three collectives above are made of: all_to_all_v's contract,
  // with `op` naming the collective in error lines and in the collective
  // record.
  virtual std::string exchange_v(const char *op, const void *send,
                                 const std::vector<size_t> &send_counts,
                                 const std::vector<size_t> &send_displs, void *recv,
                                 const std::vector<size_t> &recv_counts,
                                 const std::vector<size_t> &recv_displs, size_t elem_bytes) = 0;
};

// In-process ranks: one ThreadGroup, one communicator per thread.
class ThreadGroup {
public:
  ThreadGroup(int size, std::chrono::milliseconds timeout);
  ~ThreadGroup();
  // The communicator of rank r (0 <= r < size), for use by one thread.
  std::unique_ptr<Communicator> rank(int r);
  struct Impl;

private:
  std::shared_ptr<Impl> impl_;
};

// Ranks as processes: Gloo's TCP transport, rendezvous through a directory
// every rank can reach (Gloo's FileStore), keyed by `job`.
struct GlooOptions {
  int rank = 0;
  int world = 1;
  std::string store_dir;                 // shared directory for the rendezvous
  std::string job;                       // unique per run (e.g. SLURM job and step ids)
  std::string hostname = "127.0.0.1";    // this rank's address the others connect to
  std::chrono::milliseconds timeout{30000};
};
std::unique_ptr<Communicator> connect_gloo(const GlooOptions &options, std::string *error);

} // namespace mt::rt

#endif // MT_RUNTIME_COLLECTIVES_H
