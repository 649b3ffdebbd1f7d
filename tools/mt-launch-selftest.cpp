// mt-launch-selftest: checks a multi-rank launch end to end (srun, --nproc,
// or ranks given by hand): every rank reads its launch information, connects
// over Gloo, all-reduces [rank + 1] and meets the others at a barrier.
#include "runtime/comm/collectives.h"
#include "runtime/comm/launch.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

const char *kUsage =
    "usage: mt-launch-selftest [options]\n"
    "  (under srun, each task is one rank; outside SLURM use --nproc)\n"
    "  --nproc N            run N ranks of this test on this machine\n"
    "  --rank R --world-size W --job NAME --rendezvous-dir DIR\n"
    "                       give this rank's place by hand (override SLURM)\n"
    "  --local-rank L       this rank's index on its machine (default: R)\n"
    "  --timeout-s S        how long a collective may wait for the others (30)\n"
    "  --grace-s S          with --nproc: after a rank fails, how long the\n"
    "                       others may take to stop before they are killed (10)\n"
    "  --fail-rank R        rank R exits with status 3 before connecting\n";

int usage_error(const std::string &message) {
  std::fprintf(stderr, "mt-launch-selftest: %s\n%s", message.c_str(), kUsage);
  return 2;
}

bool parse_int(const std::string &s, int *out) {
  char *end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 0 || v > INT_MAX)
    return false;
  *out = static_cast<int>(v);
  return true;
}

} // namespace

int main(int argc, char **argv) {
  mt::rt::LaunchFlags flags;
  int nproc = 0, fail_rank = -1, timeout_s = 30, grace_s = 10;
  std::vector<std::string> rank_args; // the arguments every --nproc rank gets
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    bool takes_value = a == "--nproc" || a == "--rank" || a == "--world-size" ||
                       a == "--local-rank" || a == "--job" || a == "--rendezvous-dir" ||
                       a == "--timeout-s" || a == "--grace-s" || a == "--fail-rank";
    if (!takes_value)
      return usage_error("unknown option '" + a + "'");
    if (i + 1 >= argc)
      return usage_error(a + " needs a value");
    std::string v = argv[++i];
    int *number = a == "--nproc"        ? &nproc
                  : a == "--rank"       ? &flags.rank
                  : a == "--world-size" ? &flags.world
                  : a == "--local-rank" ? &flags.local_rank
                  : a == "--timeout-s"  ? &timeout_s
                  : a == "--grace-s"    ? &grace_s
                  : a == "--fail-rank"  ? &fail_rank
                                        : nullptr;
    if (number && !parse_int(v, number))
      return usage_error(a + " needs a whole number >= 0, got '" + v + "'");
    if (a == "--nproc" && nproc < 1)
      return usage_error("--nproc needs a number >= 1, got '" + v + "'");
    if (a == "--job")
      flags.job = v;
    if (a == "--rendezvous-dir")
      flags.rendezvous_dir = v;
    if (a != "--nproc" && a != "--grace-s") {
      rank_args.push_back(a);
      rank_args.push_back(v);
    }
  }

  if (nproc > 0) {
    // Run this very binary, whatever PATH says.
    char self[PATH_MAX + 1] = {};
    ssize_t n = ::readlink("/proc/self/exe", self, PATH_MAX);
    std::vector<std::string> command{n > 0 ? std::string(self, n) : std::string(argv[0])};
    command.insert(command.end(), rank_args.begin(), rank_args.end());
    mt::rt::LocalRunOptions options;
    options.tool = "mt-launch-selftest";
    options.grace = std::chrono::seconds(grace_s);
    return mt::rt::run_local_ranks(nproc, command, options);
  }

  std::string error;
  mt::rt::LaunchInfo info = mt::rt::launch_from_environment(flags, &error);
  if (!error.empty()) {
    std::fprintf(stderr, "mt-launch-selftest: %s\n", error.c_str());
    return 1;
  }
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, HOST_NAME_MAX);
  std::printf("rank %d of %d on %s (%s)\n", info.rank, info.world, host, info.source.c_str());
  const char *blas = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf("rank %d: OPENBLAS_NUM_THREADS=%s\n", info.rank, blas ? blas : "(unset)");
  std::fflush(stdout);

  if (info.rank == fail_rank) {
    std::fprintf(stderr, "mt-launch-selftest: rank %d stops before connecting (--fail-rank %d)\n",
                 info.rank, fail_rank);
    return 3;
  }

  std::unique_ptr<mt::rt::Communicator> comm;
  std::unique_ptr<mt::rt::ThreadGroup> alone;
  if (info.world == 1) {
    alone = std::make_unique<mt::rt::ThreadGroup>(1, std::chrono::seconds(timeout_s));
    comm = alone->rank(0);
  } else {
    error = mt::rt::prepare_rendezvous_dir(info);
    if (error.empty()) {
      mt::rt::GlooOptions options;
      options.rank = info.rank;
      options.world = info.world;
      options.store_dir = info.rendezvous_base; // Gloo's store is store_dir/job
      options.job = info.job;
      options.hostname = info.hostname;
      options.timeout = std::chrono::seconds(timeout_s);
      comm = mt::rt::connect_gloo(options, &error);
    }
    if (!comm) {
      std::fprintf(stderr, "mt-launch-selftest: %s\n", error.c_str());
      return 1;
    }
  }

  float value = static_cast<float>(info.rank + 1);
  error = comm->all_reduce(&value, 1, mt::rt::ReduceOp::Sum);
  float expected = static_cast<float>(info.world) * static_cast<float>(info.world + 1) / 2;
  if (error.empty() && value != expected)
    error = "rank " + std::to_string(info.rank) + ": all_reduce of rank + 1 over " +
            std::to_string(info.world) + " ranks gave " + std::to_string(value) + ", expected " +
            std::to_string(expected);
  if (error.empty())
    error = comm->barrier();
  if (!error.empty()) {
    std::fprintf(stderr, "mt-launch-selftest: %s\n", error.c_str());
    return 1;
  }
  // Everyone has connected and passed the barrier: the rendezvous files are
  // no longer read.
  if (info.rank == 0 && info.world > 1) {
    error = mt::rt::remove_rendezvous_dir(info);
    if (!error.empty())
      std::fprintf(stderr, "mt-launch-selftest: warning: %s\n", error.c_str());
  }
  std::printf("rank %d: all_reduce ok\n", info.rank);
  return 0;
}
