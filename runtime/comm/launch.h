// Where a process stands in a multi-rank run: its rank, the world, the nodes,
// the rendezvous directory and the address it advertises, read from SLURM's
// environment (srun), from mt's own variables (set by `--nproc` or by hand),
// or defaulting to one rank. Also the `--nproc N` launcher for one machine.
//
// The rules are written down in docs/launch.md.
#ifndef MT_RUNTIME_LAUNCH_H
#define MT_RUNTIME_LAUNCH_H

#include <chrono>
#include <string>
#include <vector>

namespace mt::rt {

struct LaunchInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;                // rank among the ranks on this node
  std::vector<std::string> nodes;    // the step's hosts, expanded; may be empty
  std::string job;                   // unique per run: "<job>.<step>" under SLURM
  std::string source = "single";     // "slurm" | "flags" | "single"
  std::string rendezvous_base;       // shared by every rank; "" for one rank
  std::string rendezvous_dir;        // rendezvous_base + "/" + job: this run's only
  std::string hostname = "127.0.0.1"; // the address the other ranks connect to
};

// Explicit values, e.g. from a tool's --rank/--world-size options; they win
// over every environment variable. -1 and "" mean "not given".
struct LaunchFlags {
  int rank = -1;
  int world = -1;
  int local_rank = -1;
  std::string rendezvous_dir;
  std::string job;
};

// Reads, in increasing priority: SLURM (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, SLURM_JOB_ID,
// SLURM_STEP_ID, SLURM_SUBMIT_DIR), mt's variables (MT_RANK, MT_WORLD_SIZE,
// MT_LOCAL_RANK, MT_RENDEZVOUS_DIR, MT_JOB, MT_HOSTNAME), then `flags`.
// On failure returns a default LaunchInfo and sets *error to one line naming
// the variable or option, its value, and what to change.
LaunchInfo launch_from_environment(const LaunchFlags &flags, std::string *error);

// SLURM's hostlist syntax: "node01", "node[01-03,07]", "a[1-2],b3",
// "rack[1-2]-n[1-2]" (every combination). The width of a range's lower bound
// is kept ("[08-10]" gives 08, 09, 10). Returns the hosts in order, or an
// empty vector and *error set to one line naming the offending part.
std::vector<std::string> expand_slurm_nodelist(const std::string &nodelist, std::string *error);

// Creates info.rendezvous_dir (and its parents) if missing; "" or one line.
std::string prepare_rendezvous_dir(const LaunchInfo &info);
// Removes the rendezvous files and the directory once every rank has
// connected (call it on one rank, after a barrier); "" or one line.
std::string remove_rendezvous_dir(const LaunchInfo &info);

struct LocalRunOptions {
  // After the first rank fails, how long the others may take to notice and
  // exit on their own before they are killed.
  std::chrono::milliseconds grace{10000};
  // Prefix every output line of rank N with "[rank N] ".
  bool prefix_output = true;
  // Launcher's own messages start with this ("mtrun", "mt-launch-selftest").
  std::string tool = "mt-launch";
  // Start every rank with SIGTERM and SIGINT blocked (the mask survives
  // exec), for programs that unblock them once their handlers are in place
  // (mtrun: unblock_stop_signals). A signal passed on while a rank is still
  // starting then waits for its handler instead of killing it.
  bool block_stop_signals = false;
};

// Installs nothing; unblocks SIGTERM and SIGINT in this thread (a rank
// started with block_stop_signals calls it after its handlers are set: a
// signal that arrived meanwhile is delivered then).
void unblock_stop_signals();

// Runs `argv` (argv[0] is the program, looked up in PATH if it has no '/')
// `nproc` times on this machine with MT_RANK, MT_WORLD_SIZE, MT_LOCAL_RANK,
// MT_RENDEZVOUS_DIR (a fresh temporary directory) and MT_JOB set, and waits
// for all of them. Returns 0 when every rank exits 0; otherwise prints one
// line naming the first rank that failed and how, and returns its exit
// status (128 + signal for a signal; 1 when it could not be started).
int run_local_ranks(int nproc, const std::vector<std::string> &argv,
                    const LocalRunOptions &options = {});

} // namespace mt::rt

#endif // MT_RUNTIME_LAUNCH_H
