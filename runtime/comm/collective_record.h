// Where each rank stands in its collectives, kept where the other ranks can
// read it without that rank's help: a small file per rank in the run's
// rendezvous directory, mapped into memory and updated as each collective
// starts and ends. When a collective times out, a survivor reads every
// member's record and names the rank(s) that never entered it, with the
// host and the last collective they did finish; it also leaves those lines
// for the `--nproc` launcher (blame files), which then names the same ranks.
//
// The rules are written down in runtime/comm/README.md ("Hung ranks").
#ifndef MT_RUNTIME_COLLECTIVE_RECORD_H
#define MT_RUNTIME_COLLECTIVE_RECORD_H

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace mt::rt {

// One operation of a rank: a collective on a group, or a send or receive.
struct CollectiveOp {
  std::string op;             // "all_reduce", "barrier", "recv", ...
  std::string group;          // the group's name: "world", "tp", "dp", ...
  uint64_t group_key = 0;     // the same on every member of one group, unlike the name
  int group_size = 0;
  uint64_t group_seq = 0;     // 1-based count of collectives on the group; 0 for send/recv
  int peer = -1;              // send/recv: the peer's world rank
  uint64_t seq = 0;           // 1-based count of this rank's operations of every kind
  uint64_t bytes = 0;
  int64_t start_ns = 0;       // wall clock (CLOCK_REALTIME), comparable across hosts
  int64_t end_ns = 0;         // 0 while it runs
  enum State : int32_t { None = 0, Running = 1, Done = 2, Failed = 3 } state = None;
};

// How far a rank got on one group.
struct GroupProgress {
  uint64_t group_key = 0;
  uint64_t entered = 0;   // group_seq of the last collective it entered
  uint64_t completed = 0; // ... and of the last it completed
};

// What a rank's record file holds, as read back.
struct CollectiveRecord {
  int rank = -1;
  long pid = 0;
  std::string host;
  CollectiveOp current;     // the latest operation (running, done or failed)
  CollectiveOp last_done;   // the latest that completed
  std::vector<GroupProgress> groups;
  // A group this rank belongs to (registered when it was connected) and
  // how far it got there; null when it is not a member (or was evicted:
  // the record keeps kMaxGroups groups).
  const GroupProgress *group(uint64_t key) const;
};

constexpr int kMaxRecordGroups = 32; // host groups (up to 10) and their GPU groups (up to 9)

// A stable 64-bit key of a group's store key (FNV-1a).
uint64_t group_key_of(const std::string &store_key);

// "<dir>/collectives": where the records and blame files of a run live.
std::string record_dir(const std::string &rendezvous_dir);

// One process's record, written by its communicators. Every method is
// cheap (a few stores to a shared mapping) and never fails the caller: a
// record that could not be created just leaves nothing to read.
class RecordWriter {
public:
  // Creates "<dir>/rank_<rank>" (dir from record_dir). "" or one line.
  std::string open(const std::string &dir, int rank, const std::string &host);
  ~RecordWriter();

  // A group this rank has joined: registered so that readers can tell a
  // member that never entered a collective from a rank outside the group.
  void join(uint64_t group_key);
  // Before the operation: returns its process-wide seq (filled into op).
  // Thread-safe, like end().
  uint64_t begin(CollectiveOp &op);
  // When it ended. Operations may end out of order (a GPU's collectives end
  // when the device finishes them, after later ones began): the record's
  // current operation stays the latest begun, its last done the latest
  // ended by seq.
  void end(const CollectiveOp &op, bool ok);

  bool is_open() const { return map_ != nullptr; }
  const std::string &path() const { return path_; }

  // The test hook: "R:N" in MT_TEST_STALL_AT_COLLECTIVE makes rank R stop
  // itself with SIGSTOP as it begins its N-th operation, before that
  // operation is recorded (a hung rank at a known point, for tests). Read
  // once by open(); only an environment variable sets it, never a plan.
  // Compiled in only where MT_TEST_HOOKS is defined (CMake option
  // MT_TEST_HOOKS, on by default so that the tests can use it).
  uint64_t stall_at() const { return stall_at_; }

private:
  void *map_ = nullptr;
  std::string path_;
  std::mutex mutex_;
  uint64_t seq_ = 0;
  uint64_t stall_at_ = 0;
};

// What the communicators of one process share about its record, for
// collectives issued elsewhere (the GPU executor's, over NCCL) to be
// recorded in the same file and judged by the same rules.
struct RecordTarget {
  RecordWriter *writer = nullptr; // the process's record, owned by its communicators
  std::string dir;                // record_dir: every rank's record and blame file
  std::string host;
  int world_rank = 0;
  std::chrono::milliseconds timeout{0}; // the run's collective timeout
};

// Reads "<dir>/rank_<rank>"; false with *error one line when it is missing
// or not a record of this version.
bool read_record(const std::string &dir, int rank, CollectiveRecord *record, std::string *error);

// What a survivor knows of the collective it timed out in.
struct WaitPoint {
  int world_rank = 0;         // the survivor
  std::string host;
  CollectiveOp op;            // its op, group, group_key, group_seq, bytes
  std::vector<int> members;   // the group's world ranks (for recv: the peer alone)
  int64_t now_ns = 0;         // wall clock at the timeout
};

// A rank named as the reason of a timeout, and the one line that says why.
struct Suspect {
  int rank = -1;
  std::string line; // "rank 1 (host H, process P) never entered ...; its last ..."
};

// Process state of `pid` on this host: 'R', 'S', 'T' (stopped), 't'
// (traced), 'Z', ..., or 0 when there is no such process.
char process_state(long pid);

// The members of w.members (other than the survivor) that did not enter the
// collective w.op, from their records (records[i] for w.members[i]; a
// missing record has rank -1), and those in it whose same-host process is
// stopped. For a recv (w.op.group_seq 0, w.members the peer alone) the peer
// is always named, with what it is doing: a record cannot tell which sends
// arrived. `state_of` gives a same-host process's state (process_state, or
// a stand-in in tests).
std::vector<Suspect> find_suspects(const WaitPoint &w, const std::vector<CollectiveRecord> &records,
                                   char (*state_of)(long pid) = process_state);

// "all_reduce #7 on group 'dp' (2 ranks, 4096 bytes)"; "recv of 64 bytes
// from rank 1 (tag 3) on group 'pp'".
std::string describe_op(const CollectiveOp &op);

// Blame files: "<dir>/blame_<rank>" holds the survivor's suspects, one
// "<rank>\t<line>" per line, written atomically before it exits.
std::string write_blame(const std::string &dir, int rank, const std::vector<Suspect> &suspects);
std::vector<Suspect> read_blame(const std::string &dir, int rank);

} // namespace mt::rt

#endif // MT_RUNTIME_COLLECTIVE_RECORD_H
