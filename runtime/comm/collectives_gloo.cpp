// The Gloo backend of collectives.h: ranks are processes, connected by
// Gloo's TCP transport after a rendezvous in a shared directory.
//
// Gloo reports failures as exceptions; each is turned here into one error
// line. Gloo's messages name socket addresses, not ranks, so every rank
// also leaves its process id and host in the store: after a failure, a peer
// on this host whose process is gone is named as the cause. Every operation
// is written to the rank's collective record (collective_record.h): after a
// timeout, the members that never entered the collective are named from
// theirs, with their host and their last collective.
#include "runtime/comm/collectives.h"
#include "runtime/base/atomic_file.h"
#include "runtime/comm/collective_record.h"
#include "runtime/comm/collectives_common.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::rt {

namespace {

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

// Point-to-point messages use their own slot space, apart from the slot
// prefixes Gloo's collectives use (gloo/types.h).
constexpr uint64_t kSendSlotBase = uint64_t(0x40) << 56;

using detail::format_duration;

// Gloo's message without its "[file:line] " prefix, on one line.
std::string gloo_message(const char *what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("] ");
    if (close != std::string::npos)
      s = s.substr(close + 2);
  }
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

bool is_timeout(const std::string &message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
}

std::string this_host() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0)
    return "?";
  return name;
}

// Whether a process of this host has exited (gone, or a zombie not yet
// reaped by its parent).
bool process_exited(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line))
    return true;
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size())
    return false;
  char state = line[close + 2];
  return state == 'Z' || state == 'X';
}

std::string make_dirs(const std::string &path) {
  std::string failed;
  int e = 0;
  if (make_directories(path, &failed, &e))
    return "";
  return "cannot create '" + failed + "': " + std::strerror(e);
}

// What every communicator of one process shares: the store, the TCP device,
// and where each world rank runs.
struct Shared {
  int world_rank = 0;
  std::string dir;
  std::string host;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<gloo::rendezvous::FileStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  bool marked_failed = false;
  std::vector<long> pids;         // by world rank
  std::vector<std::string> hosts; // by world rank
  std::string record_dir;         // every rank's collective record and blame file
  RecordWriter record;            // this rank's
};

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(std::shared_ptr<Shared> shared, std::string name, std::vector<int> world_ranks,
                   int rank)
      : shared_(std::move(shared)), name_(std::move(name)), world_ranks_(std::move(world_ranks)),
        rank_(rank) {}

  ~GlooCommunicator() override { finish_sends(pending_.size()); }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  const std::string &name() const override { return name_; }

  // Meets the other members in the store, then connects every pair. A member
  // that never comes is named by the marks the others left.
  std::string connect(const std::string &key) {
    group_key_ = group_key_of(key);
    shared_->record.join(group_key_);
    auto store = std::make_unique<gloo::rendezvous::PrefixStore>(key, *shared_->store);
    std::string what = "connect";
    try {
      store->set("arrived_" + std::to_string(rank_), {'1'});
      std::vector<std::string> keys;
      for (int r = 0; r < size(); ++r)
        keys.push_back("arrived_" + std::to_string(r));
      try {
        store->wait(keys, shared_->timeout);
      } catch (const gloo::IoException &) {
        std::vector<int> missing;
        for (int r = 0; r < size(); ++r) {
          try {
            store->wait({keys[r]}, std::chrono::milliseconds(1));
          } catch (const gloo::IoException &) {
            missing.push_back(world_ranks_[r]);
          }
        }
        return prefix(what) + " timed out after " + format_duration(shared_->timeout) + ": " +
               ranks_phrase(missing) + " never arrived (died, stuck, or not started); see " +
               (missing.size() > 1 ? "their logs" : "its log");
      }
      context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size());
      context_->setTimeout(shared_->timeout);
      context_->connectFullMesh(*store, shared_->device);
    } catch (const std::exception &e) { // gloo::Exception, gloo::EnforceNotMet
      return failure(what, e.what());
    }
    return "";
  }

  std::string all_reduce(float *data, size_t count, ReduceOp op) override {
    if (count == 0)
      return "";
    return collective("all_reduce", count * sizeof(float), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setReduceFunction(op == ReduceOp::Sum ? static_cast<ReduceFn>(&gloo::sum<float>)
                                                 : static_cast<ReduceFn>(&gloo::max<float>));
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::allreduce(opts);
    });
  }

  std::string all_gather(const float *in, size_t count, float *out) override {
    if (count == 0)
      return "";
    return collective("all_gather", count * sizeof(float), [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<float *>(in), count);
      opts.setOutput(out, count * size());
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::allgather(opts);
    });
  }

  // A sum over every block, then this rank's block: simple and exact, at
  // size() times the traffic of a true reduce-scatter.
  std::string reduce_scatter(const float *in, size_t count, float *out) override {
    if (count == 0)
      return "";
    std::vector<float> all(in, in + count * size());
    return collective("reduce_scatter", all.size() * sizeof(float), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(all.data(), all.size());
      opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::allreduce(opts);
      std::copy(all.begin() + rank_ * count, all.begin() + (rank_ + 1) * count, out);
    });
  }

  std::string broadcast(float *data, size_t count, int root) override {
    if (root < 0 || root >= size())
      return prefix("broadcast") + ": root " + std::to_string(root) +
             " is not a rank of the group; use 0.." + std::to_string(size() - 1);
    if (count == 0)
      return "";
    return collective("broadcast", count * sizeof(float), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, count);
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::broadcast(opts);
    });
  }

  std::string barrier() override {
    if (std::string err = finish_sends(pending_.size()); !err.empty())
      return err;
    return collective("barrier", 0, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::barrier(opts);
    });
  }

protected:
  // Every member's counts first (one small all_gather), so that a mismatch
  // is the same error line on every member instead of a hang; then Gloo's
  // alltoallv, whose blocks lie back to back in rank order: blocks given
  // elsewhere are packed before and unpacked after.
  std::string exchange_v(const char *name, const void *send, const std::vector<size_t> &send_counts,
                         const std::vector<size_t> &send_displs, void *recv,
                         const std::vector<size_t> &recv_counts,
                         const std::vector<size_t> &recv_displs, size_t elem_bytes) override {
    if (std::string err =
            detail::check_exchange_v(prefix(name), size(), send, send_counts, send_displs, recv,
                                     recv_counts, recv_displs, elem_bytes);
        !err.empty())
      return err;
    const int n = size();
    size_t sent = 0, received = 0;
    for (int p = 0; p < n; ++p) {
      sent += send_counts[p];
      received += recv_counts[p];
    }
    std::string mismatch;
    std::string err = collective(name, sent * elem_bytes, [&] {
      // Row of each member: element size, send counts, receive counts.
      const size_t row = 1 + 2 * size_t(n);
      std::vector<uint64_t> mine(row), all(row * n);
      mine[0] = elem_bytes;
      for (int p = 0; p < n; ++p) {
        mine[1 + p] = send_counts[p];
        mine[1 + n + p] = recv_counts[p];
      }
      gloo::AllgatherOptions gather(context_);
      gather.setInput(mine.data(), row);
      gather.setOutput(all.data(), all.size());
      gather.setTag(next_tag());
      gather.setTimeout(shared_->timeout);
      gloo::allgather(gather);
      std::vector<std::vector<size_t>> sends(n), recvs(n);
      std::vector<size_t> elems(n);
      for (int r = 0; r < n; ++r) {
        const uint64_t *at = all.data() + size_t(r) * row;
        elems[r] = at[0];
        sends[r].assign(at + 1, at + 1 + n);
        recvs[r].assign(at + 1 + n, at + 1 + 2 * n);
      }
      mismatch = detail::check_exchange_counts(world_ranks_, sends, recvs, elems);
      if (!mismatch.empty())
        return;
      // Contiguous in rank order already, or packed so.
      auto packed = [&](const std::vector<size_t> &counts, const std::vector<size_t> &displs) {
        size_t at = 0;
        for (int p = 0; p < n; ++p) {
          if (counts[p] && displs[p] != at)
            return false;
          at += counts[p];
        }
        return true;
      };
      const char *in = static_cast<const char *>(send);
      char *out = static_cast<char *>(recv);
      std::vector<char> in_buffer, out_buffer;
      if (!packed(send_counts, send_displs)) {
        in_buffer.resize(sent * elem_bytes);
        size_t at = 0;
        for (int p = 0; p < n; ++p) {
          std::memcpy(in_buffer.data() + at, in + send_displs[p] * elem_bytes,
                      send_counts[p] * elem_bytes);
          at += send_counts[p] * elem_bytes;
        }
        in = in_buffer.data();
      }
      bool unpack = !packed(recv_counts, recv_displs);
      if (unpack) {
        out_buffer.resize(received * elem_bytes);
        out = out_buffer.data();
      }
      // Gloo wants a buffer even when nothing moves.
      char none[1] = {};
      std::vector<int64_t> in_bytes(n), out_bytes(n);
      for (int p = 0; p < n; ++p) {
        in_bytes[p] = int64_t(send_counts[p] * elem_bytes);
        out_bytes[p] = int64_t(recv_counts[p] * elem_bytes);
      }
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(const_cast<char *>(sent ? in : none), in_bytes);
      opts.setOutput(received ? out : none, out_bytes);
      opts.setTag(next_tag());
      opts.setTimeout(shared_->timeout);
      gloo::alltoallv(opts);
      if (unpack) {
        size_t at = 0;
        for (int p = 0; p < n; ++p) {
          std::memcpy(static_cast<char *>(recv) + recv_displs[p] * elem_bytes,
                      out_buffer.data() + at, recv_counts[p] * elem_bytes);
          at += recv_counts[p] * elem_bytes;
        }
      }
    });
    if (err.empty() && !mismatch.empty())
      return prefix(name) + ": " + mismatch;
    return err;
  }

public:
  // Sends are buffered: Gloo moves the bytes once the peer posts the
  // matching recv, so a send returns at once and is waited for later (at
  // barrier, when too many are pending, or when the communicator goes).
  std::string send(const void *data, size_t bytes, int peer, int tag) override {
    std::string what = "send of " + std::to_string(bytes) + " bytes to rank " +
                       std::to_string(peer_world(peer)) + " (tag " + std::to_string(tag) + ")";
    if (std::string err = check_peer(what, peer); !err.empty())
      return err;
    if (bytes == 0)
      return "";
    if (pending_.size() >= kMaxPendingSends)
      if (std::string err = finish_sends(1); !err.empty())
        return err;
    CollectiveOp op = point_to_point("send", bytes, peer);
    shared_->record.begin(op);
    std::string err = guarded(what, [&] {
      PendingSend p;
      p.what = what;
      p.bytes.reset(new char[bytes]);
      std::memcpy(p.bytes.get(), data, bytes);
      p.buffer = context_->createUnboundBuffer(p.bytes.get(), bytes);
      p.buffer->send(peer, slot(tag));
      pending_.push_back(std::move(p));
    });
    shared_->record.end(op, err.empty());
    return err;
  }

  std::string recv(void *data, size_t bytes, int peer, int tag) override {
    std::string what = "recv of " + std::to_string(bytes) + " bytes from rank " +
                       std::to_string(peer_world(peer)) + " (tag " + std::to_string(tag) + ")";
    if (std::string err = check_peer(what, peer); !err.empty())
      return err;
    if (bytes == 0)
      return "";
    CollectiveOp op = point_to_point("recv", bytes, peer);
    shared_->record.begin(op);
    std::string err = guarded(
        what,
        [&] {
          auto buffer = context_->createUnboundBuffer(data, bytes);
          buffer->recv(peer, slot(tag));
          if (!buffer->waitRecv(shared_->timeout))
            throw gloo::IoException("timed out waiting for the message");
        },
        &op);
    shared_->record.end(op, err.empty());
    return err;
  }

  std::unique_ptr<Communicator> split(const std::vector<int> &ranks, const std::string &name,
                                      std::string *error) override {
    std::string what = "split into '" + name + "'";
    if (std::string e = detail::check_split(prefix(what), ranks, rank_, size()); !e.empty()) {
      *error = e;
      return nullptr;
    }
    auto self = std::find(ranks.begin(), ranks.end(), rank_);
    // Store keys must be unique per sub-group: the parent's key, the name,
    // the members, and how often this split happened before.
    std::string key = key_ + "." + name;
    std::vector<int> world;
    for (int r : ranks) {
      key += "_" + std::to_string(r);
      world.push_back(world_ranks_[r]);
    }
    key += "." + std::to_string(splits_[key]++);
    auto child = std::make_unique<GlooCommunicator>(shared_, name, std::move(world),
                                                    static_cast<int>(self - ranks.begin()));
    child->key_ = key;
    if (std::string err = child->connect(key); !err.empty()) {
      *error = err;
      return nullptr;
    }
    error->clear();
    return child;
  }

  bool record_target(RecordTarget *out) const override {
    if (!shared_->record.is_open())
      return false;
    out->writer = &shared_->record;
    out->dir = shared_->record_dir;
    out->host = shared_->host;
    out->world_rank = shared_->world_rank;
    out->timeout = shared_->timeout;
    return true;
  }

  std::string key_ = "world";

private:
  std::string prefix(const std::string &what) const {
    return detail::op_prefix(shared_->world_rank, what, name_, size());
  }

  int peer_world(int peer) const {
    return peer >= 0 && peer < size() ? world_ranks_[peer] : peer;
  }

  std::string check_peer(const std::string &what, int peer) const {
    return detail::check_peer(prefix(what), peer, rank_, size());
  }

  bool marked_failed(int world_rank) const {
    try {
      shared_->store->wait({"failed_" + std::to_string(world_rank)}, std::chrono::milliseconds(1));
      return true;
    } catch (const std::exception &) {
      return false;
    }
  }

  static std::string ranks_phrase(const std::vector<int> &ranks) {
    std::string s = ranks.size() > 1 ? "ranks " : "rank ";
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (i)
        s += i + 1 == ranks.size() ? " and " : ", ";
      s += std::to_string(ranks[i]);
    }
    return s;
  }

  // Waits for the oldest `n` pending sends.
  std::string finish_sends(size_t n) {
    std::string first_error;
    for (; n > 0 && !pending_.empty(); --n) {
      PendingSend p = std::move(pending_.front());
      pending_.pop_front();
      std::string err = guarded(p.what, [&] {
        if (!p.buffer->waitSend(shared_->timeout))
          throw gloo::IoException("the send was aborted");
      });
      if (first_error.empty())
        first_error = err;
    }
    return first_error;
  }

  uint32_t next_tag() { return tag_++; }
  static uint64_t slot(int tag) { return kSendSlotBase | static_cast<uint32_t>(tag); }

  template <class F>
  std::string guarded(const std::string &what, F &&f, const CollectiveOp *op = nullptr) {
    if (broken_)
      return prefix(what) + ": an earlier operation failed (" + broken_message_ +
             "); the group cannot be used again";
    try {
      f();
      return "";
    } catch (const std::exception &e) { // gloo::Exception, gloo::EnforceNotMet
      return failure(what, e.what(), op);
    }
  }

  // A collective of the group: numbered (the same number on every member),
  // recorded as it starts and ends, and run guarded.
  template <class F> std::string collective(const char *name, size_t bytes, F &&f) {
    CollectiveOp op;
    op.op = name;
    op.group = name_;
    op.group_key = group_key_;
    op.group_size = size();
    op.group_seq = ++group_seq_;
    op.bytes = bytes;
    shared_->record.begin(op);
    std::string err = guarded(name, std::forward<F>(f), &op);
    shared_->record.end(op, err.empty());
    return err;
  }

  CollectiveOp point_to_point(const char *name, size_t bytes, int peer) const {
    CollectiveOp op;
    op.op = name;
    op.group = name_;
    op.group_key = group_key_;
    op.group_size = size();
    op.peer = peer_world(peer);
    op.bytes = bytes;
    return op;
  }

  // After a timeout in `op`: the members whose records show they never
  // entered it (for a recv, the peer), each with its host and its last
  // collective; also left in this rank's blame file for the launcher.
  std::vector<Suspect> suspects_of(const CollectiveOp &op) {
    if (!shared_->record.is_open())
      return {};
    WaitPoint w;
    w.world_rank = shared_->world_rank;
    w.host = shared_->host;
    w.op = op;
    w.members = op.group_seq ? world_ranks_ : std::vector<int>{op.peer};
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    w.now_ns = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    std::vector<CollectiveRecord> records(w.members.size());
    for (size_t i = 0; i < w.members.size(); ++i) {
      std::string ignored; // a rank without a record is not judged
      if (w.members[i] != w.world_rank &&
          !read_record(shared_->record_dir, w.members[i], &records[i], &ignored))
        records[i].rank = -1;
    }
    return find_suspects(w, records);
  }

  // One line for a Gloo failure, naming the member whose process is gone
  // when there is one.
  std::string failure(const std::string &what, const char *raw, const CollectiveOp *op = nullptr) {
    std::string message = gloo_message(raw);
    broken_ = true;
    broken_message_ = message;
    // Ranks that saw a failure leave a mark before they exit, so that only
    // a rank that went away unmarked is named as the cause.
    if (!shared_->marked_failed && shared_->store) {
      shared_->marked_failed = true;
      try {
        shared_->store->set("failed_" + std::to_string(shared_->world_rank), {'1'});
      } catch (const std::exception &) {
      }
    }
    std::vector<int> gone;
    std::string detail;
    for (int w : world_ranks_) {
      if (w == shared_->world_rank || w >= static_cast<int>(shared_->pids.size()))
        continue;
      if (shared_->hosts[w] == shared_->host && shared_->pids[w] > 0 &&
          process_exited(shared_->pids[w]) && !marked_failed(w)) {
        gone.push_back(w);
        detail += (detail.empty() ? "" : ", ") + std::string("process ") +
                  std::to_string(shared_->pids[w]);
      }
    }
    if (!gone.empty()) {
      std::vector<Suspect> blame;
      for (int w : gone)
        blame.push_back({w, "rank " + std::to_string(w) + " (host " + shared_->host +
                                ", process " + std::to_string(shared_->pids[w]) + ") exited during " +
                                what + " on group '" + name_ + "'"});
      write_blame(shared_->record_dir, shared_->world_rank, blame);
      return prefix(what) + " failed: " + ranks_phrase(gone) + " exited (" + detail + " on " +
             shared_->host + "); see " + (gone.size() > 1 ? "their logs" : "its log") +
             " (gloo: " + message + ")";
    }
    if (is_timeout(message) && op) {
      std::vector<Suspect> suspects = suspects_of(*op);
      if (!suspects.empty()) {
        write_blame(shared_->record_dir, shared_->world_rank, suspects);
        std::string why;
        for (const Suspect &s : suspects)
          why += (why.empty() ? "" : "; and ") + s.line;
        return "rank " + std::to_string(shared_->world_rank) + ": " + describe_op(*op) +
               " timed out after " + format_duration(shared_->timeout) + ": " + why + "; see " +
               (suspects.size() > 1 ? "their logs" : "its log");
      }
    }
    if (is_timeout(message))
      return prefix(what) + " timed out after " + format_duration(shared_->timeout) +
             ": a peer never arrived (died, stuck, or on a failed host); see the other ranks' "
             "logs (gloo: " +
             message + ")";
    return prefix(what) + " failed: " + message;
  }

  std::shared_ptr<Shared> shared_;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint64_t group_key_ = 0;
  uint64_t group_seq_ = 0; // collectives started on this group
  uint32_t tag_ = 0;
  std::map<std::string, int> splits_;
  struct PendingSend {
    std::string what;
    std::unique_ptr<char[]> bytes;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  static constexpr size_t kMaxPendingSends = 64;
  std::deque<PendingSend> pending_;
  bool broken_ = false;
  std::string broken_message_;
};

} // namespace

std::unique_ptr<Communicator> connect_gloo(const GlooOptions &options, std::string *error) {
  std::string head = "rank " + std::to_string(options.rank) + ": connect_gloo";
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    *error = head + ": rank must be within 0.." + std::to_string(options.world - 1) +
             " and world at least 1";
    return nullptr;
  }
  if (options.store_dir.empty() || options.job.empty()) {
    *error = head + ": store_dir and job must be set (a shared directory and a per-run id)";
    return nullptr;
  }
  if (options.timeout.count() <= 0) {
    *error = head + ": timeout must be positive";
    return nullptr;
  }
  // A peer that dies closes its sockets; writing to them must fail with an
  // error, not kill this process.
  std::signal(SIGPIPE, SIG_IGN);

  auto shared = std::make_shared<Shared>();
  shared->world_rank = options.rank;
  shared->dir = options.store_dir + "/" + options.job;
  shared->host = this_host();
  shared->timeout = options.timeout;
  if (std::string err = make_dirs(shared->dir); !err.empty()) {
    *error = head + ": " + err;
    return nullptr;
  }
  std::vector<int> world(options.world);
  for (int r = 0; r < options.world; ++r)
    world[r] = r;
  shared->record_dir = record_dir(shared->dir);
  if (std::string err = shared->record.open(shared->record_dir, options.rank, shared->host);
      !err.empty()) {
    *error = head + ": " + err;
    return nullptr;
  }
  auto comm = std::make_unique<GlooCommunicator>(shared, "world", world, options.rank);
  try {
    shared->store = std::make_shared<gloo::rendezvous::FileStore>(shared->dir);
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    shared->device = gloo::transport::tcp::CreateDevice(attr);
    std::string me = std::to_string(getpid()) + " " + shared->host;
    shared->store->set("process_" + std::to_string(options.rank),
                       std::vector<char>(me.begin(), me.end()));
  } catch (const std::exception &e) {
    *error = head + " in '" + shared->dir + "' on " + options.hostname + " failed: " +
             gloo_message(e.what());
    return nullptr;
  }
  if (std::string err = comm->connect("world"); !err.empty()) {
    *error = err;
    return nullptr;
  }
  // Every rank wrote its process before it arrived, so these are all there.
  shared->pids.assign(options.world, 0);
  shared->hosts.assign(options.world, "");
  try {
    for (int r = 0; r < options.world; ++r) {
      std::vector<char> v = shared->store->get("process_" + std::to_string(r));
      std::string s(v.begin(), v.end());
      size_t space = s.find(' ');
      shared->pids[r] = std::atol(s.substr(0, space).c_str());
      shared->hosts[r] = space == std::string::npos ? "" : s.substr(space + 1);
    }
  } catch (const std::exception &e) {
    *error = head + ": cannot read the other ranks' process ids: " + gloo_message(e.what());
    return nullptr;
  }
  error->clear();
  return comm;
}

} // namespace mt::rt
