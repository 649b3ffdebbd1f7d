// Collective records (runtime/comm/collective_record.h): what a rank writes
// as its collectives start and end, what another process reads back, and
// which ranks a survivor of a timeout names, with what line.
#include "runtime/comm/collective_record.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using mt::rt::CollectiveOp;
using mt::rt::CollectiveRecord;
using mt::rt::Suspect;
using mt::rt::WaitPoint;

namespace {

constexpr int64_t kSecond = 1000000000;

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/mt-record-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { EXPECT_EQ(std::system(("rm -rf '" + path + "'").c_str()), 0); }
  std::string path;
};

CollectiveOp collective(const char *op, const char *group, uint64_t key, uint64_t seq,
                        uint64_t bytes, int size = 4) {
  CollectiveOp c;
  c.op = op;
  c.group = group;
  c.group_key = key;
  c.group_size = size;
  c.group_seq = seq;
  c.bytes = bytes;
  return c;
}

TEST(CollectiveRecord, WhatOneProcessWritesAnotherReads) {
  TempDir dir;
  mt::rt::RecordWriter w;
  ASSERT_EQ(w.open(dir.path, 2, "node07"), "");
  const uint64_t dp = mt::rt::group_key_of("world.dp_0_2.0");
  w.join(dp);

  CollectiveRecord r;
  std::string err;
  ASSERT_TRUE(mt::rt::read_record(dir.path, 2, &r, &err)) << err;
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.pid, long(getpid()));
  EXPECT_EQ(r.host, "node07");
  EXPECT_EQ(r.current.state, CollectiveOp::None);
  ASSERT_NE(r.group(dp), nullptr);
  EXPECT_EQ(r.group(dp)->entered, 0u);

  CollectiveOp op = collective("all_reduce", "dp", dp, 1, 4096, 2);
  EXPECT_EQ(w.begin(op), 1u);
  ASSERT_TRUE(mt::rt::read_record(dir.path, 2, &r, &err)) << err;
  EXPECT_EQ(r.current.state, CollectiveOp::Running);
  EXPECT_EQ(r.current.op, "all_reduce");
  EXPECT_EQ(r.current.seq, 1u);
  EXPECT_GT(r.current.start_ns, 0);
  EXPECT_EQ(r.group(dp)->entered, 1u);
  EXPECT_EQ(r.group(dp)->completed, 0u);
  EXPECT_EQ(r.last_done.seq, 0u);

  w.end(op, true);
  ASSERT_TRUE(mt::rt::read_record(dir.path, 2, &r, &err)) << err;
  EXPECT_EQ(r.current.state, CollectiveOp::Done);
  EXPECT_EQ(r.last_done.op, "all_reduce");
  EXPECT_EQ(r.last_done.group, "dp");
  EXPECT_EQ(r.last_done.bytes, 4096u);
  EXPECT_GE(r.last_done.end_ns, r.last_done.start_ns);
  EXPECT_EQ(r.group(dp)->completed, 1u);

  // A failed operation is the current one but not the last completed.
  CollectiveOp second = collective("barrier", "dp", dp, 2, 0, 2);
  EXPECT_EQ(w.begin(second), 2u);
  w.end(second, false);
  ASSERT_TRUE(mt::rt::read_record(dir.path, 2, &r, &err)) << err;
  EXPECT_EQ(r.current.state, CollectiveOp::Failed);
  EXPECT_EQ(r.current.op, "barrier");
  EXPECT_EQ(r.last_done.op, "all_reduce");
  EXPECT_EQ(r.group(dp)->entered, 2u);
  EXPECT_EQ(r.group(dp)->completed, 1u);
}

TEST(CollectiveRecord, KeepsTheMostRecentGroups) {
  TempDir dir;
  mt::rt::RecordWriter w;
  ASSERT_EQ(w.open(dir.path, 0, "h"), "");
  const int n = mt::rt::kMaxRecordGroups + 4;
  for (int g = 0; g < n; ++g) {
    CollectiveOp op = collective("all_reduce", "g", mt::rt::group_key_of("g" + std::to_string(g)),
                                 1, 4);
    w.join(op.group_key);
    w.begin(op);
    w.end(op, true);
  }
  CollectiveRecord r;
  std::string err;
  ASSERT_TRUE(mt::rt::read_record(dir.path, 0, &r, &err)) << err;
  EXPECT_EQ(r.groups.size(), size_t(mt::rt::kMaxRecordGroups));
  EXPECT_EQ(r.group(mt::rt::group_key_of("g0")), nullptr);
  ASSERT_NE(r.group(mt::rt::group_key_of("g" + std::to_string(n - 1))), nullptr);
  EXPECT_EQ(r.group(mt::rt::group_key_of("g" + std::to_string(n - 1)))->completed, 1u);
}

TEST(CollectiveRecord, MissingOrForeignFilesAreErrors) {
  TempDir dir;
  CollectiveRecord r;
  std::string err;
  EXPECT_FALSE(mt::rt::read_record(dir.path, 3, &r, &err));
  EXPECT_NE(err.find("rank_3"), std::string::npos) << err;
  std::ofstream(dir.path + "/rank_4") << std::string(2048, 'x');
  EXPECT_FALSE(mt::rt::read_record(dir.path, 4, &r, &err));
  EXPECT_NE(err.find("is not a collective record"), std::string::npos) << err;
}

char stopped(long) { return 'T'; }
char running(long) { return 'R'; }
char sleeping(long) { return 'S'; }

// Rank 0 timed out in all_reduce #5 of a 4-rank group: rank 1 is in it
// too, rank 2 stopped after #4, rank 3 waits in a barrier of another group,
// rank 5 is outside the group.
struct Scene {
  Scene() {
    w.world_rank = 0;
    w.host = "node1";
    w.op = collective("all_reduce", "dp", dp, 5, 4096);
    w.members = {0, 1, 2, 3, 5};
    w.now_ns = 100 * kSecond;
    records.resize(5);
    records[0].rank = -1; // the survivor's own is not read
    for (int i = 1; i < 5; ++i) {
      CollectiveRecord &r = records[i];
      r.rank = w.members[i];
      r.pid = 1000 + r.rank;
      r.host = "node1";
      r.last_done = collective("all_reduce", "dp", dp, 4, 4096);
      r.last_done.state = CollectiveOp::Done;
      r.last_done.seq = 9;
      r.last_done.end_ns = 97 * kSecond;
      r.current = r.last_done;
      r.groups = {{dp, 4, 4}, {world, 1, 1}};
    }
    records[1].groups[0] = {dp, 5, 4};
    records[1].current = collective("all_reduce", "dp", dp, 5, 4096);
    records[1].current.state = CollectiveOp::Running;
    records[3].current = collective("barrier", "world", world, 2, 0);
    records[3].current.state = CollectiveOp::Running;
    records[3].current.start_ns = 96 * kSecond + kSecond / 2;
    records[3].groups[1] = {world, 2, 1};
    records[4].groups = {{world, 1, 1}};
  }
  uint64_t dp = mt::rt::group_key_of("world.dp_0_1_2_3.0");
  uint64_t world = mt::rt::group_key_of("world");
  WaitPoint w;
  std::vector<CollectiveRecord> records;
};

TEST(CollectiveRecord, NamesTheMembersThatNeverEntered) {
  Scene s;
  std::vector<Suspect> got = mt::rt::find_suspects(s.w, s.records, sleeping);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].rank, 2);
  EXPECT_EQ(got[0].line,
            "rank 2 (host node1, process 1002) never entered all_reduce #5 on group 'dp'; its "
            "last collective was all_reduce #4 on group 'dp' (4 ranks, 4096 bytes), finished "
            "3.0 s earlier");
  EXPECT_EQ(got[1].rank, 3);
  EXPECT_EQ(got[1].line,
            "rank 3 (host node1, process 1003) never entered all_reduce #5 on group 'dp'; it "
            "has been in barrier #2 on group 'world' (4 ranks, 0 bytes) for 3.5 s; its last "
            "collective was all_reduce #4 on group 'dp' (4 ranks, 4096 bytes), finished 3.0 s "
            "earlier");
}

TEST(CollectiveRecord, SameHostProcessStateIsAdded) {
  Scene s;
  std::vector<Suspect> got = mt::rt::find_suspects(s.w, s.records, running);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[0].line.find("; its process is running (busy outside collectives)"),
            std::string::npos)
      << got[0].line;
  // A stopped process is named even when it entered the collective: it
  // cannot finish it.
  got = mt::rt::find_suspects(s.w, s.records, stopped);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].rank, 1);
  EXPECT_NE(got[0].line.find("entered all_reduce #5 on group 'dp' and stopped there; it has "
                             "been in all_reduce #5"),
            std::string::npos)
      << got[0].line;
  EXPECT_NE(got[1].line.find("; its process is stopped (SIGSTOP or a debugger)"),
            std::string::npos)
      << got[1].line;
  // Another host's process state is not known here.
  for (CollectiveRecord &r : s.records)
    r.host = "node2";
  got = mt::rt::find_suspects(s.w, s.records, stopped);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].line.find("its process"), std::string::npos) << got[0].line;
  EXPECT_NE(got[0].line.find("(host node2, process 1002)"), std::string::npos) << got[0].line;
}

TEST(CollectiveRecord, NothingToNameWhenEveryMemberEntered) {
  Scene s;
  for (CollectiveRecord &r : s.records)
    for (mt::rt::GroupProgress &g : r.groups)
      if (g.group_key == s.dp)
        g.entered = 5;
  EXPECT_TRUE(mt::rt::find_suspects(s.w, s.records, sleeping).empty());
  // A rank with no record (rank -1) is not judged either.
  s.records.assign(5, CollectiveRecord{});
  EXPECT_TRUE(mt::rt::find_suspects(s.w, s.records, sleeping).empty());
}

TEST(CollectiveRecord, ARecvNamesItsPeer) {
  Scene s;
  WaitPoint w = s.w;
  w.op = CollectiveOp{};
  w.op.op = "recv";
  w.op.group = "pp";
  w.op.peer = 2;
  w.op.bytes = 64;
  w.members = {2};
  std::vector<Suspect> got = mt::rt::find_suspects(w, {s.records[2]}, sleeping);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].line.rfind("rank 2 (host node1, process 1002) did not send the message of 64 "
                              "bytes rank 0 waits for on group 'pp'; its last collective was",
                              0),
            0u)
      << got[0].line;
}

// A send waits only where sends are not buffered (NCCL's, between GPUs):
// for the peer to receive it.
TEST(CollectiveRecord, AnUnbufferedSendNamesItsPeer) {
  Scene s;
  WaitPoint w = s.w;
  w.op = CollectiveOp{};
  w.op.op = "send";
  w.op.group = "pp (GPU)";
  w.op.peer = 2;
  w.op.bytes = 64;
  w.members = {2};
  std::vector<Suspect> got = mt::rt::find_suspects(w, {s.records[2]}, sleeping);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].line.rfind("rank 2 (host node1, process 1002) did not receive the message of "
                              "64 bytes rank 0 sends on group 'pp (GPU)'; its last collective was",
                              0),
            0u)
      << got[0].line;
}

// A GPU's collectives end when the device has finished them, after later
// ones began: the record's current operation stays the latest begun, its
// last done and each group's completed count only move forward.
TEST(CollectiveRecord, OperationsMayEndOutOfOrder) {
  TempDir dir;
  mt::rt::RecordWriter w;
  ASSERT_EQ(w.open(dir.path, 0, "node0"), "");
  const uint64_t tp = mt::rt::group_key_of("gpu:tp (GPU)_0_1");
  w.join(tp);
  CollectiveOp a = collective("all_reduce", "tp (GPU)", tp, 1, 64, 2);
  CollectiveOp b = collective("all_gather", "tp (GPU)", tp, 2, 32, 2);
  w.begin(a);
  w.begin(b);
  w.end(b, true);
  w.end(a, true); // the older one, last
  CollectiveRecord r;
  std::string err;
  ASSERT_TRUE(mt::rt::read_record(dir.path, 0, &r, &err)) << err;
  EXPECT_EQ(r.current.op, "all_gather");
  EXPECT_EQ(r.current.state, CollectiveOp::Done);
  EXPECT_EQ(r.last_done.group_seq, 2u);
  ASSERT_NE(r.group(tp), nullptr);
  EXPECT_EQ(r.group(tp)->entered, 2u);
  EXPECT_EQ(r.group(tp)->completed, 2u);
  // A later one still running stays current when an older one ends.
  CollectiveOp c = collective("all_reduce", "tp (GPU)", tp, 3, 64, 2);
  CollectiveOp d = collective("all_reduce", "tp (GPU)", tp, 4, 64, 2);
  w.begin(c);
  w.begin(d);
  w.end(c, true);
  ASSERT_TRUE(mt::rt::read_record(dir.path, 0, &r, &err)) << err;
  EXPECT_EQ(r.current.group_seq, 4u);
  EXPECT_EQ(r.current.state, CollectiveOp::Running);
  EXPECT_EQ(r.last_done.group_seq, 3u);
  EXPECT_EQ(r.group(tp)->entered, 4u);
  EXPECT_EQ(r.group(tp)->completed, 3u);
}

TEST(CollectiveRecord, BlameFilesRoundTrip) {
  TempDir dir;
  std::vector<Suspect> in = {{1, "rank 1 (host a, process 7) never entered x"}, {3, "three"}};
  ASSERT_EQ(mt::rt::write_blame(dir.path, 0, in), "");
  std::vector<Suspect> out = mt::rt::read_blame(dir.path, 0);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rank, 1);
  EXPECT_EQ(out[0].line, in[0].line);
  EXPECT_EQ(out[1].rank, 3);
  EXPECT_TRUE(mt::rt::read_blame(dir.path, 1).empty()); // none written
  std::ofstream(dir.path + "/blame_2") << "x\tno rank\n-1\tnegative\n5 no tab\n4\tfour\n";
  out = mt::rt::read_blame(dir.path, 2);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rank, 4);
}

} // namespace
