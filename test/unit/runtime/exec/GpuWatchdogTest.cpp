// The watchdog over the GPU executor's collectives (device_watchdog.h) on
// emulated GPUs, ranks as threads: every device collective reaches the
// rank's collective record as it is issued and ends there when its event
// has passed; a rank that stalls before a collective makes the other's
// run return, within the timeout and long before the host communicator's
// own, the line naming it (host, process, the collective it never
// entered, its last one), with the same line in the blame file; and a host
// that the abort cannot bring back ends the process with that line.
#include "EmulatedGpuDevice.h"

#include "runtime/comm/collective_record.h"
#include "runtime/comm/collectives.h"
#include "runtime/comm/parallel_groups.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <thread>
#include <unistd.h>

namespace {

namespace pl = mt::plan;
using namespace mt::emu;
using Clock = std::chrono::steady_clock;

std::string freshDir(const std::string &name) {
  std::string dir = ::testing::TempDir() + "/mt-watchdog-" + name + "-" + std::to_string(getpid());
  std::system(("rm -rf '" + dir + "'").c_str());
  return mt::rt::record_dir(dir);
}

// One rank: its record, its groups and its executor on an emulated GPU
// whose communicators an abort ends (EmulatedComm's abortable mode).
struct Rank {
  mt::rt::RecordWriter record;
  mt::rt::ParallelGroups groups;
  EmulatedDevice *device = nullptr;
  std::unique_ptr<mt::rt::GpuExecutor> ex;

  std::string open(const pl::Plan &plan, int rank, mt::rt::Communicator *world,
                   const std::string &dir, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds grace, bool abortable) {
    if (std::string e = record.open(dir, rank, "emu-host"); !e.empty())
      return e;
    mt::rt::ParallelLayout layout{plan.tensor_parallel(), plan.pipeline_parallel(),
                                  plan.data_parallel()};
    if (std::string e = mt::rt::make_parallel_groups(world, layout, rank, &groups); !e.empty())
      return e;
    auto d = std::make_unique<EmulatedDevice>();
    d->abortable = abortable;
    device = d.get();
    ex = std::make_unique<mt::rt::GpuExecutor>(plan, rank, std::move(d));
    ex->set_groups(&groups);
    mt::rt::RecordTarget target;
    target.writer = &record;
    target.dir = dir;
    target.host = "emu-host";
    target.world_rank = rank;
    target.timeout = timeout;
    ex->set_watchdog(target, grace);
    if (std::string e = ex->open(); !e.empty())
      return e;
    ex->set_seed(1234);
    return ex->init_params(1234);
  }

  // One micro-batch of train_step, the last one's form where there is one
  // (data-parallel reductions): a program's first run is eager, its second
  // is captured and launched, later ones launch the graph.
  std::string step(const pl::Plan &plan, int64_t n) {
    const pl::Program *last = ex->program("train_step_last");
    const pl::Program &p = last ? *last : *ex->program("train_step");
    fillInputs(*ex, p, plan.training()->vocab_size(), uint64_t(n), n, 0);
    return ex->run(p, uint64_t(n));
  }
};

// Rank 1 runs `before` micro-batches and stops there (its thread waits,
// its communicators alive, as a stopped process's would be); rank 0 runs
// one more and must come back with the watchdog's line.
struct Stall {
  std::string error0;               // what rank 0's extra run returned
  double seconds = 0;               // and how long it took
  std::vector<mt::rt::Suspect> blame; // rank 0's blame file
};

Stall stallRank1(const pl::Plan &plan, const std::string &dir, int before, bool graphs) {
  using namespace std::chrono;
  Stall out;
  // The host communicator's own timeout is far beyond the watchdog's (3 s,
  // above what one emulated rank may wait for the other's kernels): a
  // return well before it can only come from the watchdog's abort.
  mt::rt::ThreadGroup group(2, milliseconds(12000));
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<mt::rt::Communicator> c = group.rank(r);
      Rank rank;
      if (std::string e = rank.open(plan, r, c.get(), dir, milliseconds(3000), milliseconds(60000),
                                    true);
          !e.empty()) {
        errors[r] = e;
        return;
      }
      rank.ex->set_cuda_graphs(graphs);
      for (int64_t n = 1; n <= before; ++n)
        if (std::string e = rank.step(plan, n); !e.empty()) {
          errors[r] = e;
          return;
        }
      if (r == 1) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return released; });
        return;
      }
      const auto start = steady_clock::now();
      out.error0 = rank.step(plan, before + 1);
      out.seconds = duration<double>(steady_clock::now() - start).count();
      out.blame = mt::rt::read_blame(dir, 0);
      {
        std::lock_guard<std::mutex> lock(mu);
        released = true;
      }
      cv.notify_all();
    });
  for (std::thread &t : threads)
    t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  return out;
}

void expectNamed(const Stall &s, const std::string &opsRegex) {
  SCOPED_TRACE(s.error0);
  // The timeout (3 s) plus polling, far below the host communicator's 12 s.
  EXPECT_GE(s.seconds, 2.9);
  EXPECT_LT(s.seconds, 8.0);
  std::smatch m;
  const std::regex line(
      "rank 0: (" + opsRegex + ") timed out after 3 s on the GPU: (rank 1 \\(host emu-host, "
      "process " + std::to_string(getpid()) + "\\) .*; its last (?:collective|operation) was .*, "
      "finished [0-9.]+ s earlier.*); see its log");
  ASSERT_TRUE(std::regex_match(s.error0, m, line));
  ASSERT_EQ(s.blame.size(), 1u);
  EXPECT_EQ(s.blame[0].rank, 1);
  EXPECT_EQ(s.blame[0].line, m[2].str());
}

// Tensor parallelism, every run eager (the emulation runs a whole graph
// launch on the host, slower than the timeout; the death test below has
// rank 0 wait in a graph's collectives): rank 0's third run waits in its
// first all-reduce, which rank 1 never issues.
TEST(GpuWatchdog, NamesARankThatNeverEnteredACollective) {
  auto file = compilePlan({{"parallel.tensor_model_parallel_size=2"}});
  ASSERT_TRUE(file);
  const std::string dir = freshDir("tp");
  Stall s = stallRank1(*file->plan(), dir, 2, false);
  expectNamed(s, "[a-z_]+ #[0-9]+ on group '[a-z_]+ \\(GPU\\)' \\(2 ranks, [0-9]+ bytes\\)");
  // The collective it waits in is the one rank 1 never entered.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(s.error0, m, std::regex("rank 0: ([a-z_]+ #[0-9]+ on group '[a-z_]+ \\(GPU\\)')")));
  EXPECT_NE(s.error0.find("never entered " + m[1].str() + ";"), std::string::npos);
  // Rank 1's record agrees: it entered fewer collectives of that group.
  mt::rt::CollectiveRecord r1;
  std::string err;
  ASSERT_TRUE(mt::rt::read_record(dir, 1, &r1, &err)) << err;
  EXPECT_EQ(r1.current.state, mt::rt::CollectiveOp::Done);
}

// Pipeline stages, every run eager: rank 0's sends and receives of its
// next micro-batch wait for rank 1, which is named as the peer.
TEST(GpuWatchdog, NamesAPipelinePeerThatNeverSent) {
  auto file = compilePlan({{"parallel.pipeline_model_parallel_size=2"}});
  ASSERT_TRUE(file);
  Stall s = stallRank1(*file->plan(), freshDir("pp"), 1, false);
  expectNamed(s, "recv of [0-9]+ bytes from rank 1 on group 'pp \\(GPU\\)'");
  EXPECT_NE(s.error0.find("rank 1 (host emu-host, process " + std::to_string(getpid()) +
                          ") did not send the message of"),
            std::string::npos);
}

// No hang: every device collective of three runs on two tensor-parallel
// ranks (eager, captured, graph launches) reaches the record as entered
// and, once its event passed, as completed, and the watchdog never fires.
TEST(GpuWatchdog, RecordsEveryDeviceCollective) {
  using namespace std::chrono;
  auto file = compilePlan({{"parallel.tensor_model_parallel_size=2"}});
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  const std::string dir = freshDir("records");
  mt::rt::ThreadGroup group(2, milliseconds(60000));
  std::string errors[2];
  int calls[2] = {0, 0}, events[2] = {0, 0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<mt::rt::Communicator> c = group.rank(r);
      Rank rank;
      if (std::string e = rank.open(plan, r, c.get(), dir, milliseconds(60000), milliseconds(0),
                                    false);
          !e.empty()) {
        errors[r] = e;
        return;
      }
      for (int64_t n = 1; n <= 3 && errors[r].empty(); ++n)
        errors[r] = rank.step(plan, n);
      // The tp group's communicator is connected first (dp has one rank).
      if (!rank.device->comms.empty())
        calls[r] = rank.device->comms[0]->calls;
      events[r] = rank.device->eventsRecorded;
      // The watchdog ends entries as it polls (every 50 ms here).
      mt::rt::CollectiveRecord rec;
      std::string err;
      for (int i = 0; i < 100; ++i) {
        if (mt::rt::read_record(dir, r, &rec, &err) && rec.current.state == mt::rt::CollectiveOp::Done)
          break;
        std::this_thread::sleep_for(milliseconds(20));
      }
    });
  for (std::thread &t : threads)
    t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    mt::rt::CollectiveRecord rec;
    std::string err;
    ASSERT_TRUE(mt::rt::read_record(dir, r, &rec, &err)) << err;
    EXPECT_EQ(rec.current.group, "tp (GPU)");
    EXPECT_EQ(rec.current.state, mt::rt::CollectiveOp::Done);
    EXPECT_EQ(rec.last_done.seq, rec.current.seq);
    // Every collective the emulated GPU ran, numbered on its group, and
    // completed; events: one per eager batch and per graph launch.
    ASSERT_GT(calls[r], 0);
    EXPECT_EQ(rec.current.group_seq, uint64_t(calls[r]));
    const mt::rt::GroupProgress *g = rec.group(rec.current.group_key);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->entered, uint64_t(calls[r]));
    EXPECT_EQ(g->completed, uint64_t(calls[r]));
    EXPECT_GT(events[r], 0);
    EXPECT_LE(events[r], calls[r]);
  }
  EXPECT_TRUE(mt::rt::read_blame(dir, 0).empty());
}

// Rank 1 stops after one run; rank 0's next run blocks in a collective
// that the abort does not end (EmulatedComm without its abortable mode).
[[noreturn]] void stallForever(const pl::Plan &plan, const std::string &dir) {
  using namespace std::chrono;
  mt::rt::ThreadGroup group(2, milliseconds(60000));
  std::atomic<bool> ranOnce{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<mt::rt::Communicator> c = group.rank(r);
      Rank rank;
      if (!rank.open(plan, r, c.get(), dir, milliseconds(2000), milliseconds(300), false).empty() ||
          !rank.step(plan, 1).empty())
        std::_Exit(3);
      if (r == 1) {
        ranOnce = true;
        for (;;)
          std::this_thread::sleep_for(seconds(1)); // stopped
      }
      while (!ranOnce)
        std::this_thread::sleep_for(milliseconds(1));
      rank.step(plan, 2);
      std::_Exit(4); // never: the watchdog ends the process first
    });
  for (std::thread &t : threads)
    t.join();
  std::_Exit(5);
}

// A host the abort cannot bring back (the emulated collective keeps
// waiting in the host communicator, 60 s): after the grace period the
// watchdog prints the line and ends the process with status 1.
TEST(GpuWatchdogDeathTest, EndsTheProcessWhenTheHostStaysBlocked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto file = compilePlan({{"parallel.tensor_model_parallel_size=2"}});
  ASSERT_TRUE(file);
  const pl::Plan &plan = *file->plan();
  const std::string dir = freshDir("death");
  EXPECT_EXIT(stallForever(plan, dir), ::testing::ExitedWithCode(1),
      "rank 0: [a-z_]+ #[0-9]+ on group '[a-z_]+ \\(GPU\\)' \\(2 ranks, [0-9]+ bytes\\) timed "
      "out after 2 s on the GPU: rank 1 \\(host emu-host, process [0-9]+\\) never entered");
}

} // namespace
