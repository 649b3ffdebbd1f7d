// Collectives (runtime/comm/collectives.h): both backends against serial
// references, sub-groups, point to point, and failures that must end in an
// error line naming the missing rank instead of a hang.
#include "runtime/comm/collectives.h"
#include "runtime/comm/parallel_groups.h"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using mt::rt::Communicator;
using mt::rt::ReduceOp;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Values that make the summation order visible in the last bits.
float value(int rank, size_t i, int salt) {
  return 1.0f / float(3 + rank * 7 + int(i) * 5 + salt) + float(rank) * 1e-3f * float(i % 7);
}

std::vector<float> data_of(int rank, size_t count, int salt) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = value(rank, i, salt);
  return v;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs every op on `comm` and checks it against a reduction in rank order.
// Returns "" or what went wrong. `exact` asks for the serial reference's
// bits (the thread backend); otherwise sums may differ in the last bits but
// must agree across ranks.
std::string check_ops(Communicator &comm, bool exact) {
  int n = comm.size(), r = comm.rank();
  const size_t count = 37;
  auto fail = [&](const std::string &what) { return "rank " + std::to_string(r) + ": " + what; };

  // all_reduce sum and max.
  std::vector<float> sum(count, 0.0f), max(count, -1e30f);
  for (int s = 0; s < n; ++s) {
    std::vector<float> d = data_of(s, count, 1);
    for (size_t i = 0; i < count; ++i) {
      sum[i] += d[i];
      max[i] = std::max(max[i], d[i]);
    }
  }
  std::vector<float> x = data_of(r, count, 1);
  if (std::string err = comm.all_reduce(x.data(), count, ReduceOp::Sum); !err.empty())
    return err;
  for (size_t i = 0; i < count; ++i)
    if (exact ? x[i] != sum[i] : std::abs(x[i] - sum[i]) > 1e-5f * std::abs(sum[i]))
      return fail("all_reduce sum differs at " + std::to_string(i));
  // Every rank holds the same bits.
  std::vector<float> everyone(count * n);
  if (std::string err = comm.all_gather(x.data(), count, everyone.data()); !err.empty())
    return err;
  for (int s = 0; s < n; ++s)
    if (std::memcmp(everyone.data() + s * count, x.data(), count * sizeof(float)) != 0)
      return fail("all_reduce result differs between ranks " + std::to_string(r) + " and " +
                  std::to_string(s));
  std::vector<float> y = data_of(r, count, 1);
  if (std::string err = comm.all_reduce(y.data(), count, ReduceOp::Max); !err.empty())
    return err;
  if (!same_bits(y, max))
    return fail("all_reduce max differs");

  // all_gather.
  std::vector<float> mine = data_of(r, count, 2), gathered(count * n), expected;
  if (std::string err = comm.all_gather(mine.data(), count, gathered.data()); !err.empty())
    return err;
  for (int s = 0; s < n; ++s) {
    std::vector<float> d = data_of(s, count, 2);
    expected.insert(expected.end(), d.begin(), d.end());
  }
  if (!same_bits(gathered, expected))
    return fail("all_gather differs");

  // reduce_scatter.
  std::vector<float> in = data_of(r, count * n, 3), out(count), block(count, 0.0f);
  for (int s = 0; s < n; ++s) {
    std::vector<float> d = data_of(s, count * n, 3);
    for (size_t i = 0; i < count; ++i)
      block[i] += d[r * count + i];
  }
  if (std::string err = comm.reduce_scatter(in.data(), count, out.data()); !err.empty())
    return err;
  for (size_t i = 0; i < count; ++i)
    if (exact ? out[i] != block[i] : std::abs(out[i] - block[i]) > 1e-5f * std::abs(block[i]))
      return fail("reduce_scatter differs at " + std::to_string(i));

  // broadcast from the last rank.
  std::vector<float> b = data_of(r, count, 4);
  if (std::string err = comm.broadcast(b.data(), count, n - 1); !err.empty())
    return err;
  if (!same_bits(b, data_of(n - 1, count, 4)))
    return fail("broadcast differs");

  return comm.barrier();
}

// tp groups {0,1},{2,3}; dp groups {0,2},{1,3}; several rounds in both.
std::string check_split(Communicator &world, int rounds) {
  int r = world.rank();
  std::string error;
  std::vector<int> tp_ranks = {r / 2 * 2, r / 2 * 2 + 1}, dp_ranks = {r % 2, r % 2 + 2};
  auto tp = world.split(tp_ranks, "tp", &error);
  if (!tp)
    return error;
  auto dp = world.split(dp_ranks, "dp", &error);
  if (!dp)
    return error;
  if (tp->size() != 2 || tp->rank() != r % 2 || dp->rank() != r / 2)
    return "rank " + std::to_string(r) + ": wrong sub-group ranks";
  for (int i = 0; i < rounds; ++i) {
    float t[3] = {float(r), float(i), 1.0f}, d[3] = {float(r), float(i), 1.0f};
    if (std::string err = tp->all_reduce(t, 3, ReduceOp::Sum); !err.empty())
      return err;
    if (std::string err = dp->all_reduce(d, 3, ReduceOp::Sum); !err.empty())
      return err;
    float tp_sum = float(tp_ranks[0] + tp_ranks[1]), dp_sum = float(dp_ranks[0] + dp_ranks[1]);
    if (t[0] != tp_sum || t[1] != 2.0f * i || t[2] != 2.0f || d[0] != dp_sum || d[2] != 2.0f)
      return "rank " + std::to_string(r) + ": sub-group all_reduce differs in round " +
             std::to_string(i);
  }
  return "";
}

// Each rank sends to the next and receives from the previous, on two tags
// received in the opposite order to the sends.
std::string check_ring(Communicator &comm) {
  int n = comm.size(), r = comm.rank();
  if (n < 2)
    return "";
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> a = data_of(r, 100, 5), b = data_of(r, 10, 6);
  if (std::string err = comm.send(a.data(), a.size() * 4, next, 1); !err.empty())
    return err;
  if (std::string err = comm.send(b.data(), b.size() * 4, next, 2); !err.empty())
    return err;
  std::vector<float> ga(100), gb(10);
  if (std::string err = comm.recv(gb.data(), gb.size() * 4, prev, 2); !err.empty())
    return err;
  if (std::string err = comm.recv(ga.data(), ga.size() * 4, prev, 1); !err.empty())
    return err;
  if (!same_bits(ga, data_of(prev, 100, 5)) || !same_bits(gb, data_of(prev, 10, 6)))
    return "rank " + std::to_string(r) + ": ring message differs";
  return "";
}

// all_to_all_v with uneven counts, zero counts (every rank sends nothing to
// itself and some send nothing to a peer), send blocks out of rank order
// with gaps, and receive blocks either back to back or scattered; then one
// exchange where nothing moves at all, one of 2-byte elements, and
// all_gather_v / reduce_scatter_v against serial references.
size_t a2a_count(int from, int to) { return size_t(from * 3 + to * 5) % 4; }
float a2a_value(int from, int to, size_t i) { return float(from * 1000 + to * 100) + float(i); }

std::string check_all_to_all_v(Communicator &comm, bool scattered_recv) {
  int n = comm.size(), r = comm.rank();
  auto fail = [&](const std::string &what) { return "rank " + std::to_string(r) + ": " + what; };
  const float kUnused = -7.0f;
  std::vector<size_t> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
  size_t at = 0;
  for (int p = n - 1; p >= 0; --p) { // peers in reverse, one unused element apart
    send_counts[p] = a2a_count(r, p);
    send_displs[p] = at;
    at += send_counts[p] + 1;
  }
  std::vector<float> send(at, kUnused);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < send_counts[p]; ++i)
      send[send_displs[p] + i] = a2a_value(r, p, i);
  at = 0;
  for (int p = 0; p < n; ++p) {
    recv_counts[p] = a2a_count(p, r);
    recv_displs[p] = at;
    at += recv_counts[p] + (scattered_recv ? 2 : 0);
  }
  std::vector<float> recv(at, kUnused);
  if (std::string err = comm.all_to_all_v(send.data(), send_counts, send_displs, recv.data(),
                                          recv_counts, recv_displs);
      !err.empty())
    return err;
  size_t used = 0;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < recv_counts[p]; ++i, ++used)
      if (recv[recv_displs[p] + i] != a2a_value(p, r, i))
        return fail("element " + std::to_string(i) + " from rank " + std::to_string(p) +
                    " differs");
  size_t untouched = 0;
  for (float v : recv)
    untouched += v == kUnused;
  if (used + untouched != recv.size())
    return fail("all_to_all_v wrote outside the receive blocks");

  // Nothing moves: null buffers are fine with zero counts.
  std::vector<size_t> zeros(n, 0);
  if (std::string err =
          comm.all_to_all_v(static_cast<const float *>(nullptr), zeros, zeros, nullptr, zeros,
                            zeros);
      !err.empty())
    return err;

  // 2-byte elements: rank r sends p + 1 of them to p.
  std::vector<size_t> sc(n), sd(n), rc(n, size_t(r) + 1), rd(n);
  std::vector<uint16_t> small_send, small_recv(size_t(n) * (r + 1));
  for (int p = 0; p < n; ++p) {
    sc[p] = size_t(p) + 1;
    sd[p] = small_send.size();
    for (int i = 0; i <= p; ++i)
      small_send.push_back(uint16_t(r * 256 + p * 16 + i));
    rd[p] = size_t(p) * (r + 1);
  }
  if (std::string err = comm.all_to_all_v(small_send.data(), sc, sd, small_recv.data(), rc, rd,
                                          sizeof(uint16_t));
      !err.empty())
    return err;
  for (int p = 0; p < n; ++p)
    for (int i = 0; i <= r; ++i)
      if (small_recv[size_t(p) * (r + 1) + i] != uint16_t(p * 256 + r * 16 + i))
        return fail("2-byte element from rank " + std::to_string(p) + " differs");

  // all_gather_v: rank s contributes (s * 2) % 3 floats (some none).
  std::vector<size_t> counts(n);
  for (int s = 0; s < n; ++s)
    counts[s] = size_t(s * 2) % 3;
  std::vector<float> gathered_expect, mine = data_of(r, counts[r], 8);
  for (int s = 0; s < n; ++s) {
    std::vector<float> d = data_of(s, counts[s], 8);
    gathered_expect.insert(gathered_expect.end(), d.begin(), d.end());
  }
  std::vector<float> gathered(gathered_expect.size(), kUnused);
  if (std::string err = comm.all_gather_v(mine.data(), counts, gathered.data()); !err.empty())
    return err;
  if (!same_bits(gathered, gathered_expect))
    return fail("all_gather_v differs");

  // reduce_scatter_v: the sum of every rank's block r, added in rank order.
  size_t total = 0;
  for (size_t c : counts)
    total += c;
  std::vector<float> in = data_of(r, total, 9), block(counts[r], 0.0f), out(counts[r], kUnused);
  size_t offset = 0;
  for (int s = 0; s < r; ++s)
    offset += counts[s];
  for (size_t i = 0; i < counts[r]; ++i) {
    float sum = data_of(0, total, 9)[offset + i];
    for (int s = 1; s < n; ++s)
      sum += data_of(s, total, 9)[offset + i];
    block[i] = sum;
  }
  if (std::string err = comm.reduce_scatter_v(in.data(), counts, out.data()); !err.empty())
    return err;
  if (!same_bits(out, block))
    return fail("reduce_scatter_v differs");
  return "";
}

// Rank 0 sends 2 floats to rank 1, which expects 3: every rank is told, by
// the same line.
std::string mismatched_all_to_all_v(Communicator &comm) {
  int n = comm.size(), r = comm.rank();
  std::vector<size_t> sc(n, 1), rc(n, 1), sd(n), rd(n);
  if (r == 0)
    sc[1] = 2;
  if (r == 1)
    rc[0] = 3;
  size_t s = 0, t = 0;
  for (int p = 0; p < n; ++p) {
    sd[p] = s;
    rd[p] = t;
    s += sc[p];
    t += rc[p];
  }
  std::vector<float> send(s, 1.0f), recv(t);
  return comm.all_to_all_v(send.data(), sc, sd, recv.data(), rc, rd);
}

// Runs fn on `n` threads of one ThreadGroup; returns each rank's result.
std::vector<std::string> run_threads(int n, std::chrono::milliseconds timeout,
                                     const std::function<std::string(Communicator &)> &fn) {
  mt::rt::ThreadGroup group(n, timeout);
  std::vector<std::string> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.rank(r);
      results[r] = fn(*comm);
    });
  for (auto &t : threads)
    t.join();
  return results;
}

TEST(ThreadCollectives, OpsMatchSerialReference) {
  for (int n = 1; n <= 4; ++n) {
    auto results = run_threads(n, 5s, [](Communicator &c) { return check_ops(c, true); });
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(results[r], "") << n << " ranks";
  }
}

TEST(ThreadCollectives, AllToAllVUnevenAndZeroCounts) {
  for (int n = 1; n <= 4; ++n)
    for (bool scattered : {false, true}) {
      auto results = run_threads(
          n, 5s, [&](Communicator &c) { return check_all_to_all_v(c, scattered); });
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(results[r], "") << n << " ranks, scattered " << scattered;
    }
}

TEST(ThreadCollectives, AllToAllVErrors) {
  auto results = run_threads(3, 5s, mismatched_all_to_all_v);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(results[r], "rank " + std::to_string(r) +
                              ": all_to_all_v on group 'world' (3 ranks): rank 0 sends 2 "
                              "elements to rank 1, which expects 3; each rank's send count to a "
                              "peer must equal that peer's receive count from it");
  // Local argument errors, before anything is sent.
  results = run_threads(1, 5s, [](Communicator &c) -> std::string {
    float buffer[8] = {};
    std::string wrong_size = c.all_to_all_v(buffer, {1, 1}, {0, 1}, buffer + 4, {1}, {0});
    std::string overlap = c.all_to_all_v(buffer, {2}, {0}, buffer + 1, {2}, {0});
    std::string gather = c.all_gather_v(buffer, {1, 2}, buffer + 4);
    return wrong_size + "\n" + overlap + "\n" + gather;
  });
  EXPECT_EQ(results[0],
            "rank 0: all_to_all_v on group 'world' (1 ranks): send_counts has 2 entries for a "
            "group of 1 ranks; give one per rank\n"
            "rank 0: all_to_all_v on group 'world' (1 ranks): a receive block overlaps a send "
            "block; use separate buffers\n"
            "rank 0: all_gather_v on group 'world' (1 ranks): recv_counts has 2 entries for a "
            "group of 1 ranks; give one per rank");
}

TEST(ThreadCollectives, AllToAllVTimeoutNamesTheCollective) {
  auto results = run_threads(3, 200ms, [](Communicator &c) -> std::string {
    if (c.rank() == 2)
      return "";
    std::vector<size_t> one(3, 1), displs = {0, 1, 2};
    float send[3] = {}, recv[3] = {};
    return c.all_to_all_v(send, one, displs, recv, one, displs);
  });
  for (int r : {0, 1})
    EXPECT_EQ(results[r], "rank " + std::to_string(r) +
                              ": all_to_all_v on group 'world' (3 ranks) timed out after 200 ms: "
                              "rank 2 never arrived (died or stuck); see its log");
  // A different collective meeting it is named with its kind.
  results = run_threads(2, 200ms, [](Communicator &c) -> std::string {
    std::vector<size_t> one(2, 1), displs = {0, 1};
    float x[2] = {};
    if (c.rank() == 0)
      return c.all_to_all_v(x, one, displs, x + 0, {0, 0}, {0, 0}) == "" ? "" : "timed out";
    std::this_thread::sleep_for(100ms);
    return c.all_reduce(x, 2, ReduceOp::Sum);
  });
  EXPECT_EQ(results[1], "rank 1: all_reduce on group 'world' (2 ranks) of 2 floats meets "
                        "all_to_all_v of 4-byte elements from rank 0; every rank must call the "
                        "same collectives in the same order");
}

TEST(ThreadCollectives, RepeatedRunsGiveSameBits) {
  auto run = [] {
    std::vector<std::vector<float>> out(3);
    run_threads(3, 5s, [&](Communicator &c) {
      std::vector<float> x = data_of(c.rank(), 1000, 7);
      std::string err = c.all_reduce(x.data(), x.size(), ReduceOp::Sum);
      out[c.rank()] = x;
      return err;
    });
    return out;
  };
  auto first = run(), second = run();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(same_bits(first[r], first[0]));
    EXPECT_TRUE(same_bits(second[r], first[0]));
  }
}

TEST(ThreadCollectives, SplitTpDpConcurrently) {
  auto results = run_threads(4, 5s, [](Communicator &c) { return check_split(c, 50); });
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(results[r], "");
}

// Megatron's rank order (tp fastest, then dp, then pp), and that each group
// holds exactly the ranks that differ in its coordinate.
TEST(ParallelGroups, MegatronRankOrderAndGroupSums) {
  mt::rt::ParallelLayout layout{2, 2, 2};
  EXPECT_EQ(mt::rt::coords_of(layout, 5).tp, 1);
  EXPECT_EQ(mt::rt::coords_of(layout, 5).dp, 0);
  EXPECT_EQ(mt::rt::coords_of(layout, 5).pp, 1);
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(mt::rt::rank_of(layout, mt::rt::coords_of(layout, r)), r);
  auto results = run_threads(8, 5s, [&](Communicator &c) -> std::string {
    mt::rt::ParallelGroups g;
    if (std::string e = mt::rt::make_parallel_groups(&c, layout, c.rank(), &g); !e.empty())
      return e;
    // Each group sums 2^rank over its members: the bits say who was in it.
    auto sum = [&](mt::rt::Group which) -> int {
      float x = float(1 << c.rank());
      if (g.get(which)->all_reduce(&x, 1, ReduceOp::Sum) != "")
        return -1;
      return int(x);
    };
    int r = c.rank();
    int tp = sum(mt::rt::Group::TP), dp = sum(mt::rt::Group::DP), pp = sum(mt::rt::Group::PP),
        mp = sum(mt::rt::Group::MP);
    int base = r & ~1;
    std::string who = "rank " + std::to_string(r) + ": ";
    if (tp != (1 << base) + (1 << (base + 1)))
      return who + "tp group sum " + std::to_string(tp);
    if (dp != (1 << (r & ~2)) + (1 << (r | 2)))
      return who + "dp group sum " + std::to_string(dp);
    if (pp != (1 << (r & ~4)) + (1 << (r | 4)))
      return who + "pp group sum " + std::to_string(pp);
    int d = r & 2, expect = 0;
    for (int s : {0, 1, 4, 5})
      expect += 1 << (s + d);
    if (mp != expect)
      return who + "mp group sum " + std::to_string(mp);
    if (g.get(mt::rt::Group::TP)->name() != "tp")
      return who + "tp group is named " + g.get(mt::rt::Group::TP)->name();
    return "";
  });
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(results[r], "") << r;
}

TEST(ThreadCollectives, SendRecvRing) {
  for (int n = 2; n <= 4; ++n) {
    auto results = run_threads(n, 5s, check_ring);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(results[r], "") << n << " ranks";
  }
}

TEST(ThreadCollectives, MissingRankIsNamedWithinTimeout) {
  auto start = Clock::now();
  auto results = run_threads(4, 200ms, [](Communicator &c) -> std::string {
    if (c.rank() == 2)
      return "";
    float x = 1.0f;
    return c.all_reduce(&x, 1, ReduceOp::Sum);
  });
  EXPECT_LT(Clock::now() - start, 2s);
  for (int r : {0, 1, 3})
    EXPECT_EQ(results[r], "rank " + std::to_string(r) +
                              ": all_reduce on group 'world' (4 ranks) timed out after 200 ms: "
                              "rank 2 never arrived (died or stuck); see its log");
}

TEST(ThreadCollectives, MissingSubGroupRankIsNamedByWorldRank) {
  auto results = run_threads(4, 200ms, [](Communicator &c) -> std::string {
    std::string error;
    auto dp = c.split({c.rank() % 2, c.rank() % 2 + 2}, "dp", &error);
    if (!dp)
      return error;
    if (c.rank() == 3)
      return "";
    return dp->barrier();
  });
  EXPECT_EQ(results[1], "rank 1: barrier on group 'dp' (2 ranks) timed out after 200 ms: "
                        "rank 3 never arrived (died or stuck); see its log");
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[2], "");
}

TEST(ThreadCollectives, MismatchedCallsAndMissingMessages) {
  auto results = run_threads(2, 200ms, [](Communicator &c) -> std::string {
    float x[4] = {};
    if (c.rank() == 0)
      return c.all_reduce(x, 4, ReduceOp::Sum);
    std::this_thread::sleep_for(100ms); // rank 0 is waiting by now
    std::string mismatch = c.all_reduce(x, 3, ReduceOp::Sum);
    std::string missing = c.recv(x, 16, 0, 9);
    return mismatch + "\n" + missing;
  });
  EXPECT_NE(results[0].find("rank 0: all_reduce on group 'world' (2 ranks) timed out"),
            std::string::npos)
      << results[0];
  EXPECT_EQ(results[1], "rank 1: all_reduce on group 'world' (2 ranks) of 3 floats meets all_reduce of 4 floats from "
                        "rank 0; every rank must call the same collectives in the same order\n"
                        "rank 1: recv of 16 bytes from rank 0 (tag 9) on group 'world' (2 ranks) "
                        "timed out after 200 ms: rank 0 never sent it (it died, is stuck, or "
                        "sent another tag); see its log");
}

// ---------------------------------------------------------------------------
// Gloo: ranks as forked processes.
// ---------------------------------------------------------------------------

struct ProcessResult {
  int status = -1;     // exit status, or -1 when killed
  std::string message; // what the rank wrote
};

// Forks `n` ranks that connect through a fresh store directory and run fn;
// each exits 0 when fn returns "", else 1 with the line in its result file.
std::vector<ProcessResult> run_processes(int n, std::chrono::milliseconds timeout,
                                         const std::function<std::string(Communicator &)> &fn) {
  char tmpl[] = "/tmp/mt-collectives-XXXXXX";
  const char *dir = mkdtemp(tmpl);
  if (!dir)
    return {};
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      mt::rt::GlooOptions options;
      options.rank = r;
      options.world = n;
      options.store_dir = dir;
      options.job = "job";
      options.timeout = timeout;
      std::string error;
      std::string result;
      {
        // Destroyed before _exit: it finishes the buffered sends.
        auto comm = mt::rt::connect_gloo(options, &error);
        result = comm ? fn(*comm) : error;
      }
      std::ofstream(std::string(dir) + "/result_" + std::to_string(r)) << result;
      std::fflush(nullptr);
      _exit(result.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<ProcessResult> results(n);
  auto deadline = Clock::now() + 12s;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    pid_t done;
    while ((done = waitpid(pids[r], &status, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    if (done == 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
    }
    results[r].status = done == pids[r] && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(std::string(dir) + "/result_" + std::to_string(r));
    std::stringstream text;
    text << in.rdbuf();
    results[r].message = text.str();
  }
  std::string cleanup = std::string("rm -rf '") + dir + "'";
  EXPECT_EQ(std::system(cleanup.c_str()), 0);
  return results;
}

TEST(GlooCollectives, OpsMatchSerialReference) {
  for (int n : {1, 2, 3}) {
    auto results = run_processes(n, 5s, [](Communicator &c) { return check_ops(c, false); });
    ASSERT_EQ(results.size(), size_t(n));
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(results[r].status, 0) << n << " ranks, rank " << r << ": " << results[r].message;
  }
}

TEST(GlooCollectives, SplitAndSendRecvRing) {
  auto results = run_processes(4, 5s, [](Communicator &c) {
    std::string err = check_split(c, 20);
    return err.empty() ? check_ring(c) : err;
  });
  ASSERT_EQ(results.size(), 4u);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(results[r].status, 0) << "rank " << r << ": " << results[r].message;
}

TEST(GlooCollectives, AllToAllVUnevenAndZeroCounts) {
  for (int n : {1, 3}) {
    auto results = run_processes(n, 5s, [](Communicator &c) {
      std::string err = check_all_to_all_v(c, false);
      return err.empty() ? check_all_to_all_v(c, true) : err;
    });
    ASSERT_EQ(results.size(), size_t(n));
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(results[r].status, 0) << n << " ranks, rank " << r << ": " << results[r].message;
  }
}

TEST(GlooCollectives, AllToAllVMismatchIsTheSameLineEverywhere) {
  auto results = run_processes(3, 5s, mismatched_all_to_all_v);
  ASSERT_EQ(results.size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(results[r].message, "rank " + std::to_string(r) +
                                      ": all_to_all_v on group 'world' (3 ranks): rank 0 sends 2 "
                                      "elements to rank 1, which expects 3; each rank's send "
                                      "count to a peer must equal that peer's receive count "
                                      "from it");
}

// A rank that stays alive but never enters the all_to_all_v is named from
// its collective record, with the collective and its number on the group.
TEST(GlooCollectives, AllToAllVTimeoutNamesTheRankThatNeverEntered) {
  auto results = run_processes(3, 500ms, [](Communicator &c) -> std::string {
    if (std::string err = c.barrier(); !err.empty())
      return err;
    if (c.rank() == 2) {
      std::this_thread::sleep_for(1500ms);
      return "";
    }
    std::vector<size_t> one(3, 1), displs = {0, 1, 2};
    float send[3] = {}, recv[3] = {};
    std::string err = c.all_to_all_v(send, one, displs, recv, one, displs);
    return err.empty() ? "all_to_all_v succeeded without rank 2" : err;
  });
  ASSERT_EQ(results.size(), 3u);
  for (int r : {0, 1}) {
    const std::string &m = results[r].message;
    EXPECT_EQ(m.rfind("rank " + std::to_string(r) +
                          ": all_to_all_v #2 on group 'world' (3 ranks, 12 bytes) timed out after "
                          "500 ms: rank 2 (host ",
                      0),
              0u)
        << m;
    EXPECT_NE(m.find("never entered all_to_all_v #2 on group 'world'"), std::string::npos) << m;
  }
  EXPECT_EQ(results[2].status, 0) << results[2].message;
}

TEST(GlooCollectives, ExitedRankIsNamedWithoutHanging) {
  auto start = Clock::now();
  auto results = run_processes(3, 2s, [](Communicator &c) -> std::string {
    if (std::string err = c.barrier(); !err.empty())
      return err;
    if (c.rank() == 2)
      _exit(0);
    std::vector<float> x(1000, 1.0f);
    std::string err = c.all_reduce(x.data(), x.size(), ReduceOp::Sum);
    return err.empty() ? "all_reduce succeeded without rank 2" : err;
  });
  EXPECT_LT(Clock::now() - start, 6s);
  ASSERT_EQ(results.size(), 3u);
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].status, 1);
    std::string head = "rank " + std::to_string(r) + ": all_reduce on group 'world' (3 ranks) ";
    EXPECT_EQ(results[r].message.rfind(head, 0), 0u) << results[r].message;
    EXPECT_NE(results[r].message.find("rank 2 exited"), std::string::npos) << results[r].message;
    EXPECT_EQ(results[r].message.find('\n'), std::string::npos) << results[r].message;
  }
}

TEST(GlooCollectives, RankThatNeverConnectsIsNamed) {
  // Two of three ranks, as threads: rank 2 is never started.
  char tmpl[] = "/tmp/mt-collectives-XXXXXX";
  const char *dir = mkdtemp(tmpl);
  ASSERT_NE(dir, nullptr);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      mt::rt::GlooOptions options;
      options.rank = r;
      options.world = 3;
      options.store_dir = dir;
      options.job = "job";
      options.timeout = 300ms;
      auto comm = mt::rt::connect_gloo(options, &errors[r]);
      EXPECT_EQ(comm, nullptr);
    });
  for (auto &t : threads)
    t.join();
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(errors[r], "rank " + std::to_string(r) +
                             ": connect on group 'world' (3 ranks) timed out after 300 ms: rank 2 "
                             "never arrived (died, stuck, or not started); see its log");
  std::string cleanup = std::string("rm -rf '") + dir + "'";
  EXPECT_EQ(std::system(cleanup.c_str()), 0);
}

} // namespace
