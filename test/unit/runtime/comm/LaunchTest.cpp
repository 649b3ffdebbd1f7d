// Launch information: SLURM's hostlist syntax, the environment's precedence
// (flags > MT_* > SLURM), and the one-line errors.
#include "runtime/comm/launch.h"

#include <cstdlib>
#include <map>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

using mt::rt::expand_slurm_nodelist;
using mt::rt::launch_from_environment;
using mt::rt::LaunchFlags;
using mt::rt::LaunchInfo;

namespace {

using Hosts = std::vector<std::string>;

Hosts expand(const std::string &s) {
  std::string error;
  Hosts hosts = expand_slurm_nodelist(s, &error);
  EXPECT_EQ(error, "") << s;
  return hosts;
}

std::string expand_error(const std::string &s) {
  std::string error;
  Hosts hosts = expand_slurm_nodelist(s, &error);
  EXPECT_TRUE(hosts.empty()) << s;
  return error;
}

TEST(NodeList, SingleHost) { EXPECT_EQ(expand("node01"), Hosts({"node01"})); }

TEST(NodeList, RangesKeepZeroPadding) {
  EXPECT_EQ(expand("node[01-03,07]"), Hosts({"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(expand("n[08-11]"), Hosts({"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expand("n[9-10]"), Hosts({"n9", "n10"}));
  EXPECT_EQ(expand("n[007]"), Hosts({"n007"}));
}

TEST(NodeList, CommasOutsideAndInsideBrackets) {
  EXPECT_EQ(expand("a[1-2],b3"), Hosts({"a1", "a2", "b3"}));
  EXPECT_EQ(expand("a[1,3],b[2-3],c"), Hosts({"a1", "a3", "b2", "b3", "c"}));
  EXPECT_EQ(expand("gpu-node-1,gpu-node-2"), Hosts({"gpu-node-1", "gpu-node-2"}));
}

TEST(NodeList, SeveralBracketsGiveEveryCombination) {
  EXPECT_EQ(expand("r[1-2]-n[1-2]"), Hosts({"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  EXPECT_EQ(expand("[1-2]x"), Hosts({"1x", "2x"}));
}

TEST(NodeList, Errors) {
  EXPECT_EQ(expand_error(""), "empty node list");
  EXPECT_EQ(expand_error("a,,b"), "empty host name in 'a,,b'");
  EXPECT_EQ(expand_error("node[01-03"), "'[' without ']' in 'node[01-03'");
  EXPECT_EQ(expand_error("node01]"), "']' without '[' in 'node01]'");
  EXPECT_EQ(expand_error("n[1-[2]]"), "nested '[' in 'n[1-[2]]'");
  EXPECT_EQ(expand_error("n[]"), "empty brackets '[]'");
  EXPECT_EQ(expand_error("n[3-1]"), "range '3-1' in '[3-1]' runs backwards");
  EXPECT_EQ(expand_error("n[a-b]"), "'a-b' in '[a-b]' is not a number or a range like 01-03");
  EXPECT_EQ(expand_error("n[1-2,]"), "'' in '[1-2,]' is not a number or a range like 01-03");
  EXPECT_EQ(expand_error("n[0-99999999]"), "'[0-99999999]' names more than 1048576 hosts");
  EXPECT_EQ(expand_error("a[0-9999]b[0-9999]"), "'a[0-9999]b[0-9999]' names more than 1048576 hosts");
}

// Sets the launch variables for one test and restores the environment after.
class Env : public ::testing::Test {
protected:
  static constexpr const char *kNames[] = {
      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
      "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID",
      "SLURM_SUBMIT_DIR", "MT_RANK", "MT_WORLD_SIZE", "MT_LOCAL_RANK", "MT_RENDEZVOUS_DIR",
      "MT_JOB", "MT_HOSTNAME"};
  void SetUp() override {
    for (const char *name : kNames) {
      if (const char *v = std::getenv(name))
        saved_[name] = v;
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char *name : kNames) {
      ::unsetenv(name);
      auto it = saved_.find(name);
      if (it != saved_.end())
        ::setenv(name, it->second.c_str(), 1);
    }
  }
  void set(const char *name, const char *value) { ::setenv(name, value, 1); }
  void srun(const char *procid, const char *ntasks, const char *localid, const char *nodes) {
    set("SLURM_PROCID", procid);
    set("SLURM_NTASKS", ntasks);
    set("SLURM_LOCALID", localid);
    set("SLURM_STEP_NODELIST", nodes);
    set("SLURM_JOB_NODELIST", nodes);
    set("SLURM_JOB_ID", "4242");
    set("SLURM_STEP_ID", "3");
    set("SLURM_SUBMIT_DIR", "/shared/home/me/run");
  }
  LaunchInfo ok(const LaunchFlags &flags = {}) {
    std::string error;
    LaunchInfo info = launch_from_environment(flags, &error);
    EXPECT_EQ(error, "");
    return info;
  }
  std::string error(const LaunchFlags &flags = {}) {
    std::string error;
    launch_from_environment(flags, &error);
    return error;
  }

private:
  std::map<std::string, std::string> saved_;
};

TEST_F(Env, SingleRankWithoutAnything) {
  LaunchInfo info = ok();
  EXPECT_EQ(info.source, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_TRUE(info.nodes.empty());
  EXPECT_EQ(info.rendezvous_dir, "");
  EXPECT_EQ(info.hostname, "127.0.0.1");
}

TEST_F(Env, SlurmOneNode) {
  srun("2", "4", "2", "node07");
  LaunchInfo info = ok();
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world, 4);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.nodes, Hosts({"node07"}));
  EXPECT_EQ(info.job, "4242.3");
  EXPECT_EQ(info.rendezvous_base, "/shared/home/me/run/.mt-rendezvous");
  EXPECT_EQ(info.rendezvous_dir, "/shared/home/me/run/.mt-rendezvous/4242.3");
  EXPECT_EQ(info.hostname, "127.0.0.1");
}

TEST_F(Env, SlurmSeveralNodesAdvertisesTheHostName) {
  srun("5", "8", "1", "gpu[01-02]");
  LaunchInfo info = ok();
  EXPECT_EQ(info.nodes, Hosts({"gpu01", "gpu02"}));
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  EXPECT_EQ(info.hostname, name);
  set("MT_HOSTNAME", "10.0.0.5");
  EXPECT_EQ(ok().hostname, "10.0.0.5");
}

TEST_F(Env, SlurmFallsBackToTheJobNodeList) {
  srun("0", "2", "0", "a[1-2]");
  ::unsetenv("SLURM_STEP_NODELIST");
  EXPECT_EQ(ok().nodes, Hosts({"a1", "a2"}));
}

TEST_F(Env, RendezvousDirectoryFromTheEnvironmentIsKeyedByJob) {
  srun("0", "2", "0", "n1");
  set("MT_RENDEZVOUS_DIR", "/scratch/rdv");
  EXPECT_EQ(ok().rendezvous_dir, "/scratch/rdv/4242.3");
}

TEST_F(Env, MtVariablesOverrideSlurm) {
  srun("2", "4", "2", "n1");
  set("MT_RANK", "1");
  set("MT_WORLD_SIZE", "2");
  set("MT_JOB", "mine");
  set("MT_RENDEZVOUS_DIR", "/tmp/r");
  LaunchInfo info = ok();
  EXPECT_EQ(info.source, "flags");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world, 2);
  EXPECT_EQ(info.local_rank, 1); // SLURM_LOCALID belongs to SLURM's numbering
  EXPECT_EQ(info.job, "mine");
  EXPECT_EQ(info.rendezvous_dir, "/tmp/r/mine");
}

TEST_F(Env, FlagsOverrideEverything) {
  set("MT_RANK", "1");
  set("MT_WORLD_SIZE", "2");
  set("MT_JOB", "env-job");
  set("MT_RENDEZVOUS_DIR", "/tmp/env");
  LaunchFlags flags;
  flags.rank = 3;
  flags.world = 4;
  flags.local_rank = 0;
  flags.job = "flag-job";
  flags.rendezvous_dir = "/tmp/flag";
  LaunchInfo info = ok(flags);
  EXPECT_EQ(info.source, "flags");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world, 4);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.rendezvous_dir, "/tmp/flag/flag-job");
}

TEST_F(Env, OneHandGivenRankNeedsNoJob) {
  set("MT_RANK", "0");
  set("MT_WORLD_SIZE", "1");
  LaunchInfo info = ok();
  EXPECT_EQ(info.source, "flags");
  EXPECT_EQ(info.rendezvous_dir, "");
}

TEST_F(Env, SlurmErrors) {
  srun("4", "4", "0", "n1");
  EXPECT_EQ(error(), "SLURM_PROCID is 4, outside [0, SLURM_NTASKS=4)");
  srun("x", "4", "0", "n1");
  EXPECT_EQ(error(), "SLURM_PROCID is 'x', expected a whole number >= 0");
  srun("0", "0", "0", "n1");
  EXPECT_EQ(error(), "SLURM_NTASKS is 0, expected at least 1");
  srun("0", "-2", "0", "n1");
  EXPECT_EQ(error(), "SLURM_NTASKS is '-2', expected a whole number >= 0");
  srun("0", "2", "0", "n[1-");
  EXPECT_EQ(error(), "SLURM_STEP_NODELIST 'n[1-': '[' without ']' in 'n[1-'");
  srun("0", "2", "2", "n1");
  EXPECT_EQ(error(), "SLURM_LOCALID is 2, outside [0, SLURM_NTASKS=2)");
  srun("0", "2", "0", "n1");
  ::unsetenv("SLURM_LOCALID");
  EXPECT_EQ(error(), "SLURM_PROCID is set but SLURM_LOCALID is not; start the ranks with srun");
  srun("0", "2", "0", "n1");
  ::unsetenv("SLURM_STEP_ID");
  EXPECT_EQ(error(), "SLURM_PROCID is set but SLURM_STEP_ID is not; start the ranks with srun "
                     "(also inside sbatch), or set MT_JOB");
  srun("0", "2", "0", "n1");
  ::unsetenv("SLURM_STEP_NODELIST");
  ::unsetenv("SLURM_JOB_NODELIST");
  EXPECT_EQ(error(), "SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor "
                     "SLURM_JOB_NODELIST is; start the ranks with srun");
  srun("0", "2", "0", "n1");
  ::unsetenv("SLURM_SUBMIT_DIR");
  EXPECT_EQ(error(), "SLURM_SUBMIT_DIR is not set; set MT_RENDEZVOUS_DIR to a directory every "
                     "node of the job can write");
  srun("0", "2", "0", "n1");
  ::unsetenv("SLURM_NTASKS");
  EXPECT_EQ(error(), "SLURM_PROCID is set but the world size (--world-size or MT_WORLD_SIZE) is "
                     "not; give both, or neither and let srun set them");
}

TEST_F(Env, FlagErrors) {
  set("MT_RANK", "2");
  EXPECT_EQ(error(), "MT_RANK is set but the world size (--world-size or MT_WORLD_SIZE) is not; "
                     "give both, or neither and let srun set them");
  srun("0", "2", "0", "n1"); // SLURM's world does not complete a hand-given rank
  EXPECT_EQ(error(), "MT_RANK is set but the world size (--world-size or MT_WORLD_SIZE) is not; "
                     "give both, or neither and let srun set them");
  ::unsetenv("MT_RANK");
  set("MT_WORLD_SIZE", "2");
  EXPECT_EQ(error(), "MT_WORLD_SIZE is set but the rank (--rank or MT_RANK) is not; give both, "
                     "or neither and let srun set them");
}

TEST_F(Env, HandGivenRanksNeedJobAndDirectory) {
  LaunchFlags flags;
  flags.rank = 1;
  flags.world = 2;
  EXPECT_EQ(error(flags), "--rank is set but the job name (--job or MT_JOB) is not; give every "
                          "rank of one run the same name, and each run its own");
  flags.job = "j";
  EXPECT_EQ(error(flags), "--rank is set but the rendezvous directory (--rendezvous-dir or "
                          "MT_RENDEZVOUS_DIR) is not; give every rank the same directory");
  flags.job = "a/b";
  flags.rendezvous_dir = "/tmp";
  EXPECT_EQ(error(flags), "--job is 'a/b', which is not a valid file name; use letters, digits, "
                          "'.', '-' and '_'");
  flags.job = "j";
  flags.rank = 2;
  EXPECT_EQ(error(flags), "--rank is 2, outside [0, --world-size=2)");
}

TEST(Rendezvous, PrepareAndRemove) {
  char base[] = "/tmp/mt-launch-test.XXXXXX";
  ASSERT_NE(::mkdtemp(base), nullptr);
  LaunchInfo info;
  info.rendezvous_dir = std::string(base) + "/a/b/job.0";
  EXPECT_EQ(mt::rt::prepare_rendezvous_dir(info), "");
  EXPECT_EQ(mt::rt::prepare_rendezvous_dir(info), ""); // every rank may call it
  FILE *f = std::fopen((info.rendezvous_dir + "/key").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(mt::rt::remove_rendezvous_dir(info), "");
  struct stat st;
  EXPECT_NE(::stat(info.rendezvous_dir.c_str(), &st), 0);
  EXPECT_EQ(::stat((std::string(base) + "/a/b").c_str(), &st), 0);
  EXPECT_EQ(::system(("rm -rf " + std::string(base)).c_str()), 0);

  info.rendezvous_dir = "/proc/mt-cannot-exist/job";
  EXPECT_EQ(mt::rt::prepare_rendezvous_dir(info).rfind(
                "cannot create the rendezvous directory '/proc/mt-cannot-exist'", 0),
            0u);
}

TEST(LocalRanks, AllSucceed) {
  EXPECT_EQ(mt::rt::run_local_ranks(3, {"sh", "-c", "test \"$MT_WORLD_SIZE\" = 3 && "
                                                    "test -d \"$MT_RENDEZVOUS_DIR\" && test -n \"$MT_JOB\""}),
            0);
}

// A rank started with block_stop_signals holds a SIGTERM that arrives
// before it is ready (mtrun unblocks it once its handler is set): here the
// shell's own SIGTERM stays pending and it exits 0; without the option the
// same command dies of it (128 + 15).
TEST(LocalRanks, StopSignalsWaitForTheRanksHandler) {
  mt::rt::LocalRunOptions options;
  options.prefix_output = false;
  ::testing::internal::CaptureStderr();
  const int plain = mt::rt::run_local_ranks(1, {"sh", "-c", "kill -TERM $$; exit 0"}, options);
  options.block_stop_signals = true;
  const int held = mt::rt::run_local_ranks(1, {"sh", "-c", "kill -TERM $$; exit 0"}, options);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(plain, 128 + 15);
  EXPECT_EQ(held, 0);
}

// A SIGTERM to the launcher while its ranks start (here from rank 0 itself,
// as soon as it runs, while the launcher may still be starting rank 1) is
// passed on to every rank: the launcher's handler is set before the first
// fork. The ranks end by their TERM trap (status 3), the launcher lives.
TEST(LocalRanks, ASignalWhileTheRanksStartIsPassedOn) {
  mt::rt::LocalRunOptions options;
  options.prefix_output = false;
  options.grace = std::chrono::milliseconds(5000);
  ::testing::internal::CaptureStderr();
  const int rc = mt::rt::run_local_ranks(
      2, {"sh", "-c", "trap 'exit 3' TERM; if [ $MT_RANK = 0 ]; then kill -TERM $PPID; fi; "
                      "sleep 10 & wait"},
      options);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 3) << err;
}

TEST(LocalRanks, FirstFailureIsReportedAndOthersStopped) {
  mt::rt::LocalRunOptions options;
  options.grace = std::chrono::milliseconds(200);
  ::testing::internal::CaptureStderr();
  int rc = mt::rt::run_local_ranks(
      3, {"sh", "-c", "if [ $MT_RANK = 1 ]; then exit 7; fi; exec sleep 30"}, options);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 7);
  EXPECT_NE(err.find("mt-launch: rank 1 of 3 failed: it exited with status 7; stopped rank(s) 0, 2 "
                     "that were still running"),
            std::string::npos)
      << err;
}

// The rank a failed rank names in its blame file (collective_record.h) is
// the cause, not the failed rank itself: rank 1 fails, rank 0 names it and
// exits 20 ms later, often reaped in the same sweep (where rank 0, the
// lower rank, used to be named).
const char *kBlameRank1 =
    "d=\"$MT_RENDEZVOUS_DIR/$MT_JOB/collectives\"; mkdir -p \"$d\"; "
    "printf '1\\trank 1 (host h, process 9) never entered all_reduce #3 on group dp\\n' "
    "> \"$d/blame_0\"; exit 1";

TEST(LocalRanks, TheBlamedRankIsNamedNotTheFirstToExit) {
  mt::rt::LocalRunOptions options;
  options.grace = std::chrono::milliseconds(5000);
  ::testing::internal::CaptureStderr();
  int rc = mt::rt::run_local_ranks(
      2, {"sh", "-c", std::string("if [ $MT_RANK = 0 ]; then sleep 0.02; ") + kBlameRank1 +
                          "; fi; exit 9"},
      options);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 9);
  EXPECT_NE(err.find("mt-launch: rank 1 of 2 failed: it exited with status 9; rank 1 (host h, "
                     "process 9) never entered all_reduce #3 on group dp; named by rank 0, "
                     "which exited with status 1\n"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("rank 0 of 2 failed"), std::string::npos) << err;
}

TEST(LocalRanks, AHungRankIsStoppedAtOnceAndNamed) {
  mt::rt::LocalRunOptions options;
  options.grace = std::chrono::milliseconds(60000); // never waited for
  auto start = std::chrono::steady_clock::now();
  ::testing::internal::CaptureStderr();
  int rc = mt::rt::run_local_ranks(
      2, {"sh", "-c", std::string("if [ $MT_RANK = 0 ]; then sleep 0.2; ") + kBlameRank1 +
                          "; fi; kill -STOP $$"},
      options);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("mt-launch: rank 0 exited with status 1 after naming rank(s) 1 as hung; "
                     "stopping it\n"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("mt-launch: rank 1 of 2 hung: rank 1 (host h, process 9) never entered "
                     "all_reduce #3 on group dp; named by rank 0, which exited with status 1; "
                     "stopped rank(s) 1 that were still running\n"),
            std::string::npos)
      << err;
}

TEST(LocalRanks, MissingProgram) {
  ::testing::internal::CaptureStderr();
  int rc = mt::rt::run_local_ranks(1, {"/nonexistent/mt-program"});
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 127);
  EXPECT_NE(err.find("[rank 0] mt-launch: cannot run '/nonexistent/mt-program': No such file"),
            std::string::npos)
      << err;
}

} // namespace
