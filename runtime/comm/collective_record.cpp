// Each rank's record of its collectives, and what a survivor of a timeout
// reads from the others' (see collective_record.h).
#include "runtime/comm/collective_record.h"
#include "runtime/base/atomic_file.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::rt {

namespace {

// The file's layout: fixed size, host byte order (the ranks of one run
// are one build on one kind of machine). `generation` is odd while the
// writer changes the record; readers retry until they see the same even
// value around a whole copy.
struct RawOp {
  char op[24];
  char group[24];
  uint64_t group_key;
  int32_t group_size;
  int32_t peer;
  uint64_t group_seq;
  uint64_t seq;
  uint64_t bytes;
  int64_t start_ns;
  int64_t end_ns;
  int32_t state;
  int32_t unused;
};

struct RawGroup {
  uint64_t key;
  uint64_t entered;
  uint64_t completed;
  uint64_t last_use; // seq of its last collective, to evict the oldest
};

struct RawRecord {
  char magic[8]; // "MTCREC1"
  uint32_t size; // sizeof(RawRecord)
  int32_t rank;
  uint64_t generation;
  int64_t pid;
  char host[64];
  RawOp current;
  RawOp last_done;
  RawGroup groups[kMaxRecordGroups];
};

constexpr char kMagic[8] = "MTCREC1";

int64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void copy_text(char *to, size_t n, const std::string &from) {
  std::memset(to, 0, n);
  std::memcpy(to, from.data(), std::min(n - 1, from.size()));
}

std::string text_of(const char *from, size_t n) { return std::string(from, strnlen(from, n)); }

void to_raw(const CollectiveOp &op, RawOp *raw) {
  copy_text(raw->op, sizeof raw->op, op.op);
  copy_text(raw->group, sizeof raw->group, op.group);
  raw->group_key = op.group_key;
  raw->group_size = op.group_size;
  raw->peer = op.peer;
  raw->group_seq = op.group_seq;
  raw->seq = op.seq;
  raw->bytes = op.bytes;
  raw->start_ns = op.start_ns;
  raw->end_ns = op.end_ns;
  raw->state = op.state;
}

CollectiveOp from_raw(const RawOp &raw) {
  CollectiveOp op;
  op.op = text_of(raw.op, sizeof raw.op);
  op.group = text_of(raw.group, sizeof raw.group);
  op.group_key = raw.group_key;
  op.group_size = raw.group_size;
  op.peer = raw.peer;
  op.group_seq = raw.group_seq;
  op.seq = raw.seq;
  op.bytes = raw.bytes;
  op.start_ns = raw.start_ns;
  op.end_ns = raw.end_ns;
  op.state = raw.state >= CollectiveOp::None && raw.state <= CollectiveOp::Failed
                 ? CollectiveOp::State(raw.state)
                 : CollectiveOp::None;
  return op;
}

std::string record_path(const std::string &dir, int rank) {
  return dir + "/rank_" + std::to_string(rank);
}

std::string seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", double(std::max<int64_t>(ns, 0)) / 1e9);
  return buf;
}

} // namespace

const GroupProgress *CollectiveRecord::group(uint64_t key) const {
  for (const GroupProgress &g : groups)
    if (g.group_key == key)
      return &g;
  return nullptr;
}

uint64_t group_key_of(const std::string &store_key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : store_key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h ? h : 1; // 0 marks a free slot
}

std::string record_dir(const std::string &rendezvous_dir) { return rendezvous_dir + "/collectives"; }

std::string RecordWriter::open(const std::string &dir, int rank, const std::string &host) {
  std::string failed;
  int e = 0;
  if (!make_directories(dir, &failed, &e))
    return "cannot create '" + failed + "': " + std::strerror(e);
  path_ = record_path(dir, rank);
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return "cannot create '" + path_ + "': " + std::strerror(errno);
  if (::ftruncate(fd, sizeof(RawRecord)) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    return "cannot size '" + path_ + "': " + why;
  }
  void *map = ::mmap(nullptr, sizeof(RawRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED)
    return "cannot map '" + path_ + "': " + std::strerror(errno);
  auto *r = static_cast<RawRecord *>(map);
  std::memset(r, 0, sizeof *r);
  r->size = sizeof(RawRecord);
  r->rank = rank;
  r->pid = ::getpid();
  copy_text(r->host, sizeof r->host, host);
  std::memcpy(r->magic, kMagic, sizeof kMagic); // last: a reader sees a whole header or none
  map_ = map;
#ifdef MT_TEST_HOOKS
  if (const char *hook = std::getenv("MT_TEST_STALL_AT_COLLECTIVE")) {
    int hook_rank = -1;
    unsigned long long n = 0;
    char extra = 0;
    if (std::sscanf(hook, "%d:%llu%c", &hook_rank, &n, &extra) != 2 || n == 0)
      std::fprintf(stderr, "rank %d: warning: MT_TEST_STALL_AT_COLLECTIVE='%s' is not RANK:N "
                   "(N >= 1); the test hook is off\n", rank, hook);
    else if (hook_rank == rank) {
      stall_at_ = n;
      std::fprintf(stderr, "rank %d: test hook MT_TEST_STALL_AT_COLLECTIVE=%s: this rank stops "
                   "itself (SIGSTOP) as it begins its operation %llu\n", rank, hook, n);
    }
  }
#endif
  return "";
}

RecordWriter::~RecordWriter() {
  if (map_)
    ::munmap(map_, sizeof(RawRecord));
}

namespace {
// Brackets a change of the record: readers skip what they see in between.
struct Change {
  explicit Change(RawRecord *r) : r(r) {
    __atomic_store_n(&r->generation, r->generation + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
  }
  ~Change() { __atomic_store_n(&r->generation, r->generation + 1, __ATOMIC_RELEASE); }
  RawRecord *r;
};

RawGroup *find_group(RawRecord *r, uint64_t key, bool add) {
  RawGroup *oldest = &r->groups[0];
  for (RawGroup &g : r->groups) {
    if (g.key == key)
      return &g;
    if (g.last_use < oldest->last_use || (oldest->key != 0 && g.key == 0))
      oldest = &g;
  }
  if (!add)
    return nullptr;
  *oldest = RawGroup{key, 0, 0, 0};
  return oldest;
}
} // namespace

void RecordWriter::join(uint64_t group_key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!map_)
    return;
  auto *r = static_cast<RawRecord *>(map_);
  Change change(r);
  find_group(r, group_key, true)->last_use = seq_;
}

uint64_t RecordWriter::begin(CollectiveOp &op) {
  std::lock_guard<std::mutex> lock(mutex_);
  op.seq = ++seq_;
#ifdef MT_TEST_HOOKS
  if (stall_at_ != 0 && op.seq == stall_at_)
    std::raise(SIGSTOP); // the test hook (see the header): hung before this op is recorded
#endif
  op.start_ns = wall_ns();
  op.end_ns = 0;
  op.state = CollectiveOp::Running;
  if (!map_)
    return op.seq;
  auto *r = static_cast<RawRecord *>(map_);
  Change change(r);
  to_raw(op, &r->current);
  if (op.group_seq > 0) {
    RawGroup *g = find_group(r, op.group_key, true);
    g->entered = op.group_seq;
    g->last_use = op.seq;
  }
  return op.seq;
}

void RecordWriter::end(const CollectiveOp &op, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!map_)
    return;
  CollectiveOp done = op;
  done.end_ns = wall_ns();
  done.state = ok ? CollectiveOp::Done : CollectiveOp::Failed;
  auto *r = static_cast<RawRecord *>(map_);
  Change change(r);
  // A device's collectives end after later ones began (they complete on
  // the GPU while the host issues more): `current` stays the latest begun.
  if (r->current.seq <= op.seq)
    to_raw(done, &r->current);
  if (ok) {
    if (r->last_done.seq <= op.seq)
      to_raw(done, &r->last_done);
    if (op.group_seq > 0)
      if (RawGroup *g = find_group(r, op.group_key, false))
        g->completed = std::max(g->completed, op.group_seq);
  }
}

bool read_record(const std::string &dir, int rank, CollectiveRecord *record, std::string *error) {
  const std::string path = record_path(dir, rank);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = "cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  RawRecord a{}, b{};
  bool stable = false;
  for (int attempt = 0; attempt < 100 && !stable; ++attempt) {
    ssize_t na = ::pread(fd, &a, sizeof a, 0);
    ssize_t nb = ::pread(fd, &b, sizeof b, 0);
    if (na != ssize_t(sizeof a) || nb != ssize_t(sizeof b)) {
      ::close(fd);
      *error = "'" + path + "' is not a collective record (" + std::to_string(std::max<ssize_t>(na, 0)) +
               " bytes, expected " + std::to_string(sizeof a) + ")";
      return false;
    }
    stable = a.generation % 2 == 0 && std::memcmp(&a, &b, sizeof a) == 0;
    if (!stable)
      ::usleep(100);
  }
  ::close(fd);
  if (std::memcmp(a.magic, kMagic, sizeof kMagic) != 0 || a.size != sizeof(RawRecord)) {
    *error = "'" + path + "' is not a collective record of this mt";
    return false;
  }
  if (!stable) {
    *error = "'" + path + "' kept changing while it was read";
    return false;
  }
  record->rank = a.rank;
  record->pid = long(a.pid);
  record->host = text_of(a.host, sizeof a.host);
  record->current = from_raw(a.current);
  record->last_done = from_raw(a.last_done);
  record->groups.clear();
  for (const RawGroup &g : a.groups)
    if (g.key != 0)
      record->groups.push_back({g.key, g.entered, g.completed});
  error->clear();
  return true;
}

char process_state(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (pid <= 0 || !stat || !std::getline(stat, line))
    return 0;
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size())
    return '?';
  return line[close + 2];
}

std::string describe_op(const CollectiveOp &op) {
  if (op.group_seq == 0) // send or recv
    return op.op + " of " + std::to_string(op.bytes) + " bytes " +
           (op.op == "recv" ? "from" : "to") + " rank " + std::to_string(op.peer) +
           " on group '" + op.group + "'";
  return op.op + " #" + std::to_string(op.group_seq) + " on group '" + op.group + "' (" +
         std::to_string(op.group_size) + " ranks, " + std::to_string(op.bytes) + " bytes)";
}

std::vector<Suspect> find_suspects(const WaitPoint &w, const std::vector<CollectiveRecord> &records,
                                   char (*state_of)(long pid)) {
  std::vector<Suspect> out;
  const bool p2p = w.op.group_seq == 0;
  for (size_t i = 0; i < w.members.size() && i < records.size(); ++i) {
    const int m = w.members[i];
    const CollectiveRecord &rec = records[i];
    if (m == w.world_rank || rec.rank != m)
      continue; // itself, or no record to judge by
    const bool same_host = rec.host == w.host;
    const char state = same_host ? state_of(rec.pid) : '?';
    const bool stopped = state == 'T' || state == 't';
    std::string line = "rank " + std::to_string(m) + " (host " + rec.host + ", process " +
                       std::to_string(rec.pid) + ") ";
    // The waited-for operation, named so that the line stands alone (the
    // launcher prints it as it is).
    // A send waits only where sends are not buffered (NCCL's): for the
    // peer's receive.
    const bool send = p2p && w.op.op == "send";
    const std::string waited = p2p ? "the message of " + std::to_string(w.op.bytes) +
                                         " bytes rank " + std::to_string(w.world_rank) +
                                         (send ? " sends" : " waits for") + " on group '" +
                                         w.op.group + "'"
                                   : w.op.op + " #" + std::to_string(w.op.group_seq) +
                                         " on group '" + w.op.group + "'";
    if (p2p) {
      line += (send ? "did not receive " : "did not send ") + waited;
    } else {
      const GroupProgress *g = rec.group(w.op.group_key);
      if (!g)
        continue; // not a member, as far as its record knows
      if (g->entered >= w.op.group_seq && !stopped)
        continue; // it is in it too (or past it): waiting for someone else
      line += (g->entered >= w.op.group_seq ? "entered " + waited + " and stopped there"
                                             : "never entered " + waited);
    }
    const CollectiveOp &cur = rec.current;
    if (cur.state == CollectiveOp::Running)
      line += "; it has been in " + describe_op(cur) + " for " +
              seconds(w.now_ns - cur.start_ns);
    if (rec.last_done.seq > 0)
      line += std::string("; its last ") +
              (rec.last_done.group_seq ? "collective" : "operation") + " was " +
              describe_op(rec.last_done) + ", finished " +
              seconds(w.now_ns - rec.last_done.end_ns) + " earlier";
    else
      line += "; it has finished no collective yet";
    if (stopped)
      line += "; its process is stopped (SIGSTOP or a debugger)";
    else if (same_host && (state == 0 || state == 'Z' || state == 'X'))
      line += "; its process has exited";
    else if (same_host && state == 'R')
      line += "; its process is running (busy outside collectives)";
    out.push_back({m, line});
  }
  return out;
}

std::string write_blame(const std::string &dir, int rank, const std::vector<Suspect> &suspects) {
  std::string text;
  for (const Suspect &s : suspects)
    text += std::to_string(s.rank) + "\t" + s.line + "\n";
  return write_file_atomically(dir + "/blame_" + std::to_string(rank), text);
}

std::vector<Suspect> read_blame(const std::string &dir, int rank) {
  std::vector<Suspect> out;
  std::ifstream in(dir + "/blame_" + std::to_string(rank));
  std::string line;
  while (std::getline(in, line)) {
    size_t tab = line.find('\t');
    char *end = nullptr;
    long r = std::strtol(line.c_str(), &end, 10);
    if (tab == std::string::npos || end != line.c_str() + tab || r < 0 || r > 1 << 20)
      continue;
    out.push_back({int(r), line.substr(tab + 1)});
  }
  return out;
}

} // namespace mt::rt
