// The watchdog over a rank's device collectives (device_watchdog.h).
#include "runtime/exec/device_watchdog.h"
#include "runtime/comm/collectives_common.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace mt::rt {

namespace {

size_t element_bytes(CommElement t) {
  switch (t) {
  case CommElement::F64: return 8;
  case CommElement::F32: return 4;
  case CommElement::BF16:
  case CommElement::F16: return 2;
  }
  return 4;
}

int64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

} // namespace

// A device event shared by the operations issued before it was recorded;
// released when the last of them is done with.
struct DeviceWatchdog::Event {
  Event(GpuDevice &d, uint64_t h) : device(d), handle(h) {}
  ~Event() {
    if (handle)
      device.release_event(handle);
  }
  GpuDevice &device;
  uint64_t handle;
  bool done = false;
  std::string error;
};

DeviceWatchdog::DeviceWatchdog(GpuDevice &device, const RecordTarget &target,
                               std::chrono::milliseconds grace)
    : device_(device), target_(target), grace_(grace) {
  if (grace_.count() <= 0)
    grace_ = std::min(target_.timeout, std::chrono::milliseconds(10000));
#ifdef MT_TEST_HOOKS
  // MT_TEST_STALL_AT_GPU_COLLECTIVE=R:N: world rank R stops itself with
  // SIGSTOP as it issues its N-th device collective, before it is recorded
  // (runtime/comm/README.md, "Test hooks").
  if (const char *hook = std::getenv("MT_TEST_STALL_AT_GPU_COLLECTIVE")) {
    int hook_rank = -1;
    unsigned long long n = 0;
    char extra = 0;
    if (std::sscanf(hook, "%d:%llu%c", &hook_rank, &n, &extra) != 2 || n == 0)
      std::fprintf(stderr, "rank %d: warning: MT_TEST_STALL_AT_GPU_COLLECTIVE='%s' is not RANK:N "
                   "(N >= 1); the test hook is off\n", target_.world_rank, hook);
    else if (hook_rank == target_.world_rank) {
      stall_at_ = n;
      std::fprintf(stderr, "rank %d: test hook MT_TEST_STALL_AT_GPU_COLLECTIVE=%s: this rank "
                   "stops itself (SIGSTOP) as it issues its device collective %llu\n",
                   target_.world_rank, hook, n);
    }
  }
#endif
  thread_ = std::thread([this] { loop(); });
}

DeviceWatchdog::~DeviceWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable())
    thread_.join();
  pending_.clear(); // releases the events while the device is still there
}

std::unique_ptr<DeviceComm> DeviceWatchdog::watch(std::unique_ptr<DeviceComm> inner,
                                                  const std::string &group,
                                                  const std::vector<int> &members) {
  auto w = std::make_unique<WatchedComm>(*this, std::move(inner), group + " (GPU)", members);
  target_.writer->join(w->key_);
  std::lock_guard<std::mutex> lock(mu_);
  comms_.push_back(w.get());
  return w;
}

void DeviceWatchdog::begin_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  capturing_ = true;
  captured_.clear();
}

std::vector<CapturedCollective> DeviceWatchdog::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  capturing_ = false;
  return std::move(captured_);
}

std::string DeviceWatchdog::launch(const std::vector<CapturedCollective> &collectives,
                                   const std::function<std::string()> &run) {
  for (const CapturedCollective &c : collectives)
    begin(*c.comm, c.op.c_str(), c.bytes, c.peer);
  return issued(run());
}

bool DeviceWatchdog::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

std::string DeviceWatchdog::message() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fired_)
    acknowledged_ = true;
  return message_;
}

void DeviceWatchdog::begin(WatchedComm &comm, const char *op, uint64_t bytes, int peer) {
  std::unique_lock<std::mutex> lock(mu_);
  if (capturing_) {
    captured_.push_back({&comm, op, bytes, peer});
    return;
  }
#ifdef MT_TEST_HOOKS
  if (stall_at_ != 0 && ++issued_count_ == stall_at_) {
    lock.unlock();
    std::raise(SIGSTOP); // the test hook: hung before this collective is recorded
    lock.lock();
  }
#endif
  Pending p;
  p.op = comm.make_op(op, bytes, peer);
  p.members = peer >= 0 ? std::vector<int>{peer} : comm.members_;
  p.issued = std::chrono::steady_clock::now();
  target_.writer->begin(p.op);
  pending_.push_back(std::move(p));
}

std::string DeviceWatchdog::issued(const std::string &issue_error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capturing_)
    return issue_error;
  auto unrecorded = [](const Pending &p) { return !p.event; };
  if (std::none_of(pending_.begin(), pending_.end(), unrecorded))
    return issue_error;
  std::string error = issue_error;
  uint64_t handle = 0;
  if (error.empty())
    error = device_.record_event(&handle);
  if (!error.empty()) {
    // Not issued (or not watchable): failed in the record, not waited for.
    for (const Pending &p : pending_)
      if (!p.event)
        target_.writer->end(p.op, false);
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), unrecorded), pending_.end());
    return error;
  }
  auto event = std::make_shared<Event>(device_, handle);
  for (Pending &p : pending_)
    if (!p.event)
      p.event = event;
  return "";
}

void DeviceWatchdog::poll_locked() {
  for (Pending &p : pending_)
    if (p.event && !p.event->done)
      p.event->done = device_.event_done(p.event->handle, &p.event->error);
  auto done = [](const Pending &p) { return p.event && p.event->done; };
  for (const Pending &p : pending_)
    if (done(p))
      target_.writer->end(p.op, p.event->error.empty());
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), done), pending_.end());
}

void DeviceWatchdog::fire_locked(const Pending &p, std::chrono::steady_clock::time_point now) {
  WaitPoint w;
  w.world_rank = target_.world_rank;
  w.host = target_.host;
  w.op = p.op;
  w.members = p.members;
  w.now_ns = wall_ns();
  std::vector<CollectiveRecord> records(w.members.size());
  for (size_t i = 0; i < w.members.size(); ++i) {
    std::string ignored; // a rank without a record is not judged
    if (w.members[i] == w.world_rank ||
        !read_record(target_.dir, w.members[i], &records[i], &ignored))
      records[i].rank = -1;
  }
  std::vector<Suspect> suspects = find_suspects(w, records);
  const std::string head = "rank " + std::to_string(target_.world_rank) + ": " +
                           describe_op(p.op) + " timed out after " +
                           detail::format_duration(target_.timeout) + " on the GPU";
  if (!suspects.empty()) {
    write_blame(target_.dir, target_.world_rank, suspects);
    std::string why;
    for (const Suspect &s : suspects)
      why += (why.empty() ? "" : "; and ") + s.line;
    message_ = head + ": " + why + "; see " + (suspects.size() > 1 ? "their logs" : "its log");
  } else {
    message_ = head + ": every member entered it (a rank stuck inside it, or a GPU or network "
                      "fault; NCCL_DEBUG=WARN says more); see the other ranks' logs";
  }
  fired_ = true;
  fired_at_ = now;
}

void DeviceWatchdog::abort_all() {
  std::vector<WatchedComm *> comms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comms = comms_;
  }
  for (WatchedComm *c : comms)
    c->abort();
}

void DeviceWatchdog::loop() {
  using Clock = std::chrono::steady_clock;
  const auto poll = std::clamp(target_.timeout / 20, std::chrono::milliseconds(1),
                               std::chrono::milliseconds(50));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, poll, [&] { return stop_; });
    if (stop_)
      break;
    const Clock::time_point now = Clock::now();
    if (fired_) {
      if (!acknowledged_ && now - fired_at_ >= grace_) {
        // The host did not come back with the line after the abort.
        std::fprintf(stderr, "%s\n", message_.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
      continue;
    }
    poll_locked();
    for (const Pending &p : pending_)
      if (now - p.issued >= target_.timeout) {
        // Of a batch of sends and receives, which progress together, a
        // receive names what is missing best.
        const Pending *named = &p;
        if (p.op.op == "send")
          for (const Pending &q : pending_)
            if (q.event == p.event && q.op.op == "recv" && q.op.group_key == p.op.group_key) {
              named = &q;
              break;
            }
        fire_locked(*named, now);
        lock.unlock();
        abort_all(); // ends the kernels the host may be waiting for
        lock.lock();
        break;
      }
  }
}

WatchedComm::WatchedComm(DeviceWatchdog &dog, std::unique_ptr<DeviceComm> inner,
                         std::string group, std::vector<int> members)
    : dog_(dog), inner_(std::move(inner)), group_(std::move(group)), members_(std::move(members)) {
  std::string key = "gpu:" + group_;
  for (int m : members_)
    key += "_" + std::to_string(m);
  key_ = group_key_of(key);
}

CollectiveOp WatchedComm::make_op(const std::string &op, uint64_t bytes, int peer) {
  CollectiveOp o;
  o.op = op;
  o.group = group_;
  o.group_key = key_;
  o.group_size = size();
  o.bytes = bytes;
  o.peer = peer;
  if (peer < 0)
    o.group_seq = ++seq_;
  return o;
}

std::string WatchedComm::issue(const char *op, uint64_t bytes, int peer,
                               const std::function<std::string()> &call) {
  dog_.begin(*this, op, bytes, peer);
  std::string e = call();
  if (depth_ > 0 && e.empty())
    return ""; // the group's end records the event
  return dog_.issued(e);
}

std::string WatchedComm::all_reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                                    ReduceOp op, double scale) {
  return issue("all_reduce", count * element_bytes(t), -1,
               [&] { return inner_->all_reduce(in, out, count, t, op, scale); });
}

std::string WatchedComm::all_gather(uint64_t in, uint64_t out, uint64_t count, CommElement t) {
  return issue("all_gather", count * element_bytes(t), -1,
               [&] { return inner_->all_gather(in, out, count, t); });
}

std::string WatchedComm::reduce_scatter(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                                        double scale) {
  return issue("reduce_scatter", count * uint64_t(size()) * element_bytes(t), -1,
               [&] { return inner_->reduce_scatter(in, out, count, t, scale); });
}

std::string WatchedComm::reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                                int root) {
  return issue("reduce", count * element_bytes(t), -1,
               [&] { return inner_->reduce(in, out, count, t, root); });
}

// One record for the whole group of reduces, as all_to_all_v's.
std::string WatchedComm::reduce_scatter_v(uint64_t in, const std::vector<uint64_t> &counts,
                                          uint64_t out, CommElement t) {
  uint64_t total = 0;
  for (uint64_t c : counts)
    total += c;
  return issue("reduce_scatter_v", total * element_bytes(t), -1,
               [&] { return inner_->reduce_scatter_v(in, counts, out, t); });
}

std::string WatchedComm::group_start() {
  ++depth_;
  return inner_->group_start();
}

std::string WatchedComm::group_end() {
  std::string e = inner_->group_end();
  if (depth_ > 0 && --depth_ > 0)
    return e;
  return dog_.issued(e);
}

std::string WatchedComm::send(uint64_t buf, uint64_t count, CommElement t, int peer) {
  const int world = peer >= 0 && peer < int(members_.size()) ? members_[size_t(peer)] : peer;
  return issue("send", count * element_bytes(t), std::max(world, 0),
               [&] { return inner_->send(buf, count, t, peer); });
}

std::string WatchedComm::recv(uint64_t buf, uint64_t count, CommElement t, int peer) {
  const int world = peer >= 0 && peer < int(members_.size()) ? members_[size_t(peer)] : peer;
  return issue("recv", count * element_bytes(t), std::max(world, 0),
               [&] { return inner_->recv(buf, count, t, peer); });
}

std::string WatchedComm::all_to_all_v(uint64_t send, const std::vector<uint64_t> &send_counts,
                                      const std::vector<uint64_t> &send_displs, uint64_t recv,
                                      const std::vector<uint64_t> &recv_counts,
                                      const std::vector<uint64_t> &recv_displs, CommElement t) {
  uint64_t sent = 0;
  for (uint64_t c : send_counts)
    sent += c;
  return issue("all_to_all_v", sent * element_bytes(t), -1, [&] {
    return inner_->all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  });
}

} // namespace mt::rt
