// The host's watch over a rank's collectives on its GPU. NCCL's kernels
// wait for a peer without end, so a rank that stopped before a collective
// (SIGSTOP, a deadlock, a host stuck elsewhere) would leave the others'
// GPUs spinning and their hosts blocked in a stream wait. Instead:
//   - every device collective is written to the rank's collective record
//     (runtime/comm/collective_record.h, the file the Gloo groups write:
//     the op, its number on its group, the group, the bytes) as it is
//     issued, its group named "<group> (GPU)" ("tp (GPU)") with a key of
//     its own, and an event is recorded after it on its stream (after a
//     group_start..group_end batch, after a graph launch);
//   - a thread polls those events (GpuDevice::event_done) and ends each
//     record entry when its event has passed;
//   - when one has not passed within the run's collective timeout (mtrun
//     --timeout / --distributed-timeout-minutes, the Gloo groups' own),
//     counted from its issue as PyTorch's NCCL watchdog counts from a
//     work's creation, the thread reads the members' records, names the
//     ranks that never entered the collective by the Gloo path's rules
//     (find_suspects: rank, host, process, stopped / exited / running,
//     their last collective), leaves those lines in the blame file for
//     the `--nproc` launcher, and aborts every communicator of the rank
//     (DeviceComm::abort: ncclCommAbort), which ends the spinning kernels.
//     The executor returns that one line from the call that was waiting
//     (message()); a host still blocked after a grace period (a call that
//     does not return after the abort) gets the line printed on stderr
//     and the process ends with status 1. It never hangs.
// A captured CUDA graph's collectives are issued, and recorded, at each
// launch of the graph, with one event after it: a survivor names the
// first collective of the graph that has not completed there.
#ifndef MT_RUNTIME_DEVICE_WATCHDOG_H
#define MT_RUNTIME_DEVICE_WATCHDOG_H

#include "runtime/comm/collective_record.h"
#include "runtime/exec/gpu_executor.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mt::rt {

class WatchedComm;

// One collective of a captured graph, issued again at each launch.
struct CapturedCollective {
  WatchedComm *comm = nullptr;
  std::string op;
  uint64_t bytes = 0;
  int peer = -1; // send/recv: the peer's world rank
};

class DeviceWatchdog {
public:
  // `target`: the process's record and timeout (its writer must outlive
  // the watchdog). `grace`: how long after the abort the host may take to
  // return the line before the process ends; 0: min(timeout, 10 s).
  DeviceWatchdog(GpuDevice &device, const RecordTarget &target,
                 std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  ~DeviceWatchdog(); // stops the thread; releases the events

  // The watched form of a group's communicator (it owns `inner`): `group`
  // is the plan group's name ("tp"), `members` its world ranks by group
  // rank. Every member wraps its communicator in the same order.
  std::unique_ptr<DeviceComm> watch(std::unique_ptr<DeviceComm> inner, const std::string &group,
                                    const std::vector<int> &members);

  // Graph capture: between these, collectives are kept, not recorded;
  // launch() records them and runs `run` (the device's launch_graph).
  void begin_capture();
  std::vector<CapturedCollective> end_capture();
  std::string launch(const std::vector<CapturedCollective> &collectives,
                     const std::function<std::string()> &run);

  // Whether a collective timed out; the line naming the hung rank(s). The
  // executor returns it instead of what the aborted calls said, and so
  // tells the watchdog that the host has it (no grace-period exit).
  bool fired() const;
  std::string message();

  std::chrono::milliseconds timeout() const { return target_.timeout; }

private:
  friend class WatchedComm;
  struct Event;
  struct Pending {
    CollectiveOp op;
    std::vector<int> members; // the group's world ranks (send/recv: the peer)
    std::chrono::steady_clock::time_point issued;
    std::shared_ptr<Event> event; // null until recorded
  };
  // Before an operation is issued: recorded (or kept, under capture).
  void begin(WatchedComm &comm, const char *op, uint64_t bytes, int peer);
  // After the issue of everything begun so far: one event for all of it,
  // or their end as failed when the issue failed. Returns `issue_error`,
  // or the event's error.
  std::string issued(const std::string &issue_error);
  void loop();
  void poll_locked();
  void fire_locked(const Pending &p, std::chrono::steady_clock::time_point now);
  void abort_all();

  GpuDevice &device_;
  RecordTarget target_;
  std::chrono::milliseconds grace_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<WatchedComm *> comms_;
  bool capturing_ = false;
  std::vector<CapturedCollective> captured_;
  bool stop_ = false, fired_ = false, acknowledged_ = false;
  std::string message_;
  std::chrono::steady_clock::time_point fired_at_;
  uint64_t stall_at_ = 0, issued_count_ = 0; // the test hook (device_watchdog.cpp)
  std::thread thread_;
};

// A device group's communicator whose calls the watchdog records and
// watches (made by DeviceWatchdog::watch).
class WatchedComm final : public DeviceComm {
public:
  WatchedComm(DeviceWatchdog &dog, std::unique_ptr<DeviceComm> inner, std::string group,
              std::vector<int> members);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string all_reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t, ReduceOp op,
                         double scale) override;
  std::string all_gather(uint64_t in, uint64_t out, uint64_t count, CommElement t) override;
  std::string reduce_scatter(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                             double scale) override;
  std::string reduce(uint64_t in, uint64_t out, uint64_t count, CommElement t,
                     int root) override;
  std::string reduce_scatter_v(uint64_t in, const std::vector<uint64_t> &counts, uint64_t out,
                               CommElement t) override;
  std::string group_start() override;
  std::string send(uint64_t buf, uint64_t count, CommElement t, int peer) override;
  std::string recv(uint64_t buf, uint64_t count, CommElement t, int peer) override;
  std::string group_end() override;
  std::string all_to_all_v(uint64_t send, const std::vector<uint64_t> &send_counts,
                           const std::vector<uint64_t> &send_displs, uint64_t recv,
                           const std::vector<uint64_t> &recv_counts,
                           const std::vector<uint64_t> &recv_displs, CommElement t) override;
  void abort() override { inner_->abort(); }

private:
  friend class DeviceWatchdog;
  // Records the call, issues it, and (outside a group) its event.
  std::string issue(const char *op, uint64_t bytes, int peer,
                    const std::function<std::string()> &call);
  CollectiveOp make_op(const std::string &op, uint64_t bytes, int peer);
  DeviceWatchdog &dog_;
  std::unique_ptr<DeviceComm> inner_;
  std::string group_;        // "tp (GPU)"
  std::vector<int> members_; // world ranks by group rank
  uint64_t key_ = 0;
  uint64_t seq_ = 0;         // collectives issued on the group
  int depth_ = 0;            // group_start nesting
};

} // namespace mt::rt

#endif // MT_RUNTIME_DEVICE_WATCHDOG_H
