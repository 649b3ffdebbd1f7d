// The in-process backend of collectives.h: ranks are threads sharing memory.
//
// Each group (the world and every split) has one state guarded by a mutex.
// A collective is a rendezvous: ranks publish their buffers and wait; the
// last to arrive computes every rank's output, reducing in rank order, so
// results are bit-identical on every rank and from run to run. A rank that
// waits longer than the timeout withdraws and reports the ranks that never
// came.
#include "runtime/comm/collectives.h"
#include "runtime/comm/collectives_common.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

namespace mt::rt {

namespace {

using Clock = std::chrono::steady_clock;

enum class Op { AllReduce, AllGather, ReduceScatter, Broadcast, Barrier, ExchangeV };

const char *op_name(Op op) {
  switch (op) {
  case Op::AllReduce:
    return "all_reduce";
  case Op::AllGather:
    return "all_gather";
  case Op::ReduceScatter:
    return "reduce_scatter";
  case Op::Broadcast:
    return "broadcast";
  case Op::Barrier:
    return "barrier";
  case Op::ExchangeV:
    return "all_to_all_v";
  }
  return "?";
}

std::string join_ranks(const std::vector<int> &ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i)
      s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

using detail::format_duration;

// What one rank brings to a collective.
struct Arrival {
  const float *in = nullptr;
  float *out = nullptr;
  // ExchangeV: the bytes and the rank's counts and displacements (elements).
  const void *send = nullptr;
  void *recv = nullptr;
  const std::vector<size_t> *send_counts = nullptr, *send_displs = nullptr,
                            *recv_counts = nullptr, *recv_displs = nullptr;
  size_t elem_bytes = 0;
};

struct GroupState {
  std::string name;
  std::vector<int> world_ranks; // world rank of each member, by group rank
  std::chrono::milliseconds timeout;

  std::mutex mu;
  std::condition_variable cv;

  // The collective being assembled. `round` counts completed collectives.
  uint64_t round = 0;
  int arrived = 0;
  Op op = Op::Barrier;
  std::string vop; // ExchangeV: the collective's name ("all_to_all_v", ...)
  size_t count = 0;
  int root = 0;
  ReduceOp reduce = ReduceOp::Sum;
  std::vector<bool> present;
  // Who came to this round, including ranks that gave up waiting: only the
  // others are reported as missing.
  std::vector<bool> came;
  std::vector<Arrival> arrivals;
  std::vector<float> scratch;
  // Why the last round failed on every member ("" when it did not): an
  // ExchangeV whose members disagree on their counts.
  std::string round_error;

  // Point-to-point messages, by (source, destination, tag) in group ranks.
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mail;

  // Sub-groups, keyed by name and member list.
  std::map<std::string, std::shared_ptr<GroupState>> children;

  GroupState(std::string n, std::vector<int> ranks, std::chrono::milliseconds t)
      : name(std::move(n)), world_ranks(std::move(ranks)), timeout(t),
        present(world_ranks.size(), false), came(world_ranks.size(), false), arrivals(world_ranks.size()) {}

  int size() const { return static_cast<int>(world_ranks.size()); }

  // Computes every rank's output once all have arrived (mu held).
  void complete() {
    int n = size();
    round_error.clear();
    switch (op) {
    case Op::AllReduce:
    case Op::ReduceScatter: {
      size_t total = op == Op::AllReduce ? count : count * n;
      scratch.assign(arrivals[0].in, arrivals[0].in + total);
      for (int r = 1; r < n; ++r) {
        const float *in = arrivals[r].in;
        if (reduce == ReduceOp::Sum)
          for (size_t i = 0; i < total; ++i)
            scratch[i] += in[i];
        else
          for (size_t i = 0; i < total; ++i)
            scratch[i] = std::max(scratch[i], in[i]);
      }
      for (int r = 0; r < n; ++r) {
        const float *src = op == Op::AllReduce ? scratch.data() : scratch.data() + r * count;
        std::memcpy(arrivals[r].out, src, count * sizeof(float));
      }
      break;
    }
    case Op::AllGather:
      for (int r = 0; r < n; ++r)
        for (int s = 0; s < n; ++s)
          std::memcpy(arrivals[r].out + s * count, arrivals[s].in, count * sizeof(float));
      break;
    case Op::Broadcast:
      for (int r = 0; r < n; ++r)
        if (r != root)
          std::memcpy(arrivals[r].out, arrivals[root].in, count * sizeof(float));
      break;
    case Op::Barrier:
      break;
    case Op::ExchangeV:
      exchange();
      break;
    }
    ++round;
    arrived = 0;
    std::fill(present.begin(), present.end(), false);
    std::fill(came.begin(), came.end(), false);
    cv.notify_all();
  }

  // Every rank's receive blocks from every sender, once the members agree.
  void exchange() {
    int n = size();
    std::vector<std::vector<size_t>> sends(n), recvs(n);
    std::vector<size_t> elems(n);
    for (int r = 0; r < n; ++r) {
      sends[r] = *arrivals[r].send_counts;
      recvs[r] = *arrivals[r].recv_counts;
      elems[r] = arrivals[r].elem_bytes;
    }
    round_error = detail::check_exchange_counts(world_ranks, sends, recvs, elems);
    if (!round_error.empty())
      return;
    size_t eb = elems[0];
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p) {
        size_t bytes = (*arrivals[r].recv_counts)[p] * eb;
        if (bytes == 0)
          continue;
        const char *from =
            static_cast<const char *>(arrivals[p].send) + (*arrivals[p].send_displs)[r] * eb;
        char *to = static_cast<char *>(arrivals[r].recv) + (*arrivals[r].recv_displs)[p] * eb;
        std::memcpy(to, from, bytes);
      }
  }
};

class ThreadCommunicator final : public Communicator {
public:
  ThreadCommunicator(std::shared_ptr<GroupState> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const std::string &name() const override { return group_->name; }

  std::string all_reduce(float *data, size_t count, ReduceOp op) override {
    return collective(Op::AllReduce, count, 0, op, data, data);
  }
  std::string all_gather(const float *in, size_t count, float *out) override {
    return collective(Op::AllGather, count, 0, ReduceOp::Sum, in, out);
  }
  std::string reduce_scatter(const float *in, size_t count, float *out) override {
    return collective(Op::ReduceScatter, count, 0, ReduceOp::Sum, in, out);
  }
  std::string broadcast(float *data, size_t count, int root) override {
    if (root < 0 || root >= size())
      return prefix("broadcast") + ": root " + std::to_string(root) +
             " is not a rank of the group; use 0.." + std::to_string(size() - 1);
    return collective(Op::Broadcast, count, root, ReduceOp::Sum, data, data);
  }
  std::string barrier() override {
    return collective(Op::Barrier, 0, 0, ReduceOp::Sum, nullptr, nullptr);
  }

protected:
  std::string exchange_v(const char *op, const void *send, const std::vector<size_t> &send_counts,
                         const std::vector<size_t> &send_displs, void *recv,
                         const std::vector<size_t> &recv_counts,
                         const std::vector<size_t> &recv_displs, size_t elem_bytes) override {
    if (std::string err =
            detail::check_exchange_v(prefix(op), size(), send, send_counts, send_displs, recv,
                                     recv_counts, recv_displs, elem_bytes);
        !err.empty())
      return err;
    Arrival a;
    a.send = send;
    a.recv = recv;
    a.send_counts = &send_counts;
    a.send_displs = &send_displs;
    a.recv_counts = &recv_counts;
    a.recv_displs = &recv_displs;
    a.elem_bytes = elem_bytes;
    return collective(Op::ExchangeV, elem_bytes, 0, ReduceOp::Sum, nullptr, nullptr, op, &a);
  }

public:
  std::string send(const void *data, size_t bytes, int peer, int tag) override {
    if (std::string err = check_peer("send", peer); !err.empty())
      return err;
    const char *p = static_cast<const char *>(data);
    GroupState &g = *group_;
    std::lock_guard<std::mutex> lock(g.mu);
    g.mail[{rank_, peer, tag}].emplace_back(p, p + bytes);
    g.cv.notify_all();
    return "";
  }

  std::string recv(void *data, size_t bytes, int peer, int tag) override {
    if (std::string err = check_peer("recv", peer); !err.empty())
      return err;
    GroupState &g = *group_;
    std::unique_lock<std::mutex> lock(g.mu);
    auto key = std::make_tuple(peer, rank_, tag);
    bool got = g.cv.wait_until(lock, Clock::now() + g.timeout, [&] {
      auto it = g.mail.find(key);
      return it != g.mail.end() && !it->second.empty();
    });
    std::string what = "recv of " + std::to_string(bytes) + " bytes from rank " +
                       std::to_string(g.world_ranks[peer]) + " (tag " + std::to_string(tag) + ")";
    if (!got)
      return prefix(what) + " timed out after " + format_duration(g.timeout) + ": rank " +
             std::to_string(g.world_ranks[peer]) +
             " never sent it (it died, is stuck, or sent another tag); see its log";
    auto it = g.mail.find(key);
    std::vector<char> message = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty())
      g.mail.erase(it);
    if (message.size() != bytes)
      return prefix(what) + ": rank " + std::to_string(g.world_ranks[peer]) + " sent " +
             std::to_string(message.size()) + " bytes; both sides must agree on the size";
    std::memcpy(data, message.data(), bytes);
    return "";
  }

  std::unique_ptr<Communicator> split(const std::vector<int> &ranks, const std::string &name,
                                      std::string *error) override {
    if (std::string err = check_split(ranks, name); !err.empty()) {
      *error = err;
      return nullptr;
    }
    GroupState &g = *group_;
    std::string key = name + ":";
    std::vector<int> world;
    for (int r : ranks) {
      key += " " + std::to_string(r);
      world.push_back(g.world_ranks[r]);
    }
    std::shared_ptr<GroupState> child;
    {
      std::lock_guard<std::mutex> lock(g.mu);
      std::shared_ptr<GroupState> &slot = g.children[key];
      if (!slot)
        slot = std::make_shared<GroupState>(name, world, g.timeout);
      child = slot;
    }
    int index = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
    error->clear();
    return std::make_unique<ThreadCommunicator>(std::move(child), index);
  }

private:
  std::string prefix(const std::string &what) const {
    return detail::op_prefix(group_->world_ranks[rank_], what, group_->name, size());
  }

  std::string check_peer(const char *what, int peer) const {
    return detail::check_peer(prefix(what), peer, rank_, size());
  }

  std::string check_split(const std::vector<int> &ranks, const std::string &name) const {
    return detail::check_split(prefix("split into '" + name + "'"), ranks, rank_, size());
  }

  // "all_reduce of 4 floats", "all_to_all_v of 4-byte elements".
  static std::string describe(Op op, const std::string &vop, size_t count) {
    if (op == Op::ExchangeV)
      return vop + " of " + std::to_string(count) + "-byte elements";
    return std::string(op_name(op)) + " of " + std::to_string(count) + " floats";
  }

  // `vop` and `exchange`: an ExchangeV's name and this rank's arguments.
  std::string collective(Op op, size_t count, int root, ReduceOp reduce, const float *in,
                         float *out, const char *vop = "", const Arrival *exchange = nullptr) {
    GroupState &g = *group_;
    std::string name = op == Op::ExchangeV ? vop : op_name(op);
    std::unique_lock<std::mutex> lock(g.mu);
    if (g.arrived > 0 && (g.op != op || g.count != count || g.root != root || g.reduce != reduce ||
                          (op == Op::ExchangeV && g.vop != vop))) {
      int first = static_cast<int>(std::find(g.present.begin(), g.present.end(), true) -
                                   g.present.begin());
      return prefix(name) + " " + describe(op, vop, count).substr(name.size() + 1) + " meets " +
             describe(g.op, g.vop, g.count) + " from rank " +
             std::to_string(g.world_ranks[first]) +
             "; every rank must call the same collectives in the same order";
    }
    g.op = op;
    g.vop = vop;
    g.count = count;
    g.root = root;
    g.reduce = reduce;
    g.present[rank_] = true;
    g.came[rank_] = true;
    if (exchange)
      g.arrivals[rank_] = *exchange;
    else
      g.arrivals[rank_] = {in, out};
    auto outcome = [&] {
      return g.round_error.empty() ? std::string() : prefix(name) + ": " + g.round_error;
    };
    if (++g.arrived == g.size()) {
      g.complete();
      return outcome();
    }
    uint64_t round = g.round;
    if (g.cv.wait_until(lock, Clock::now() + g.timeout, [&] { return g.round != round; }))
      return outcome();
    std::vector<int> missing;
    for (int r = 0; r < g.size(); ++r)
      if (!g.came[r])
        missing.push_back(g.world_ranks[r]);
    // Withdraw, so a late rank waits afresh rather than completing with
    // buffers this rank no longer lends.
    g.present[rank_] = false;
    if (--g.arrived == 0)
      std::fill(g.came.begin(), g.came.end(), false);
    return prefix(name) + " timed out after " + format_duration(g.timeout) + ": rank" +
           (missing.size() > 1 ? "s " : " ") + join_ranks(missing) + " never arrived" +
           " (died or stuck); see " + (missing.size() > 1 ? "their logs" : "its log");
  }

  std::shared_ptr<GroupState> group_;
  int rank_;
};

} // namespace

struct ThreadGroup::Impl {
  std::shared_ptr<GroupState> world;
};

ThreadGroup::ThreadGroup(int size, std::chrono::milliseconds timeout)
    : impl_(std::make_shared<Impl>()) {
  std::vector<int> ranks(size > 0 ? size : 0);
  for (int r = 0; r < size; ++r)
    ranks[r] = r;
  impl_->world = std::make_shared<GroupState>("world", std::move(ranks), timeout);
}

ThreadGroup::~ThreadGroup() = default;

std::unique_ptr<Communicator> ThreadGroup::rank(int r) {
  if (r < 0 || r >= impl_->world->size())
    return nullptr;
  return std::make_unique<ThreadCommunicator>(impl_->world, r);
}

} // namespace mt::rt
