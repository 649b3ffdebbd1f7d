// Launch information from SLURM or mt's variables, and the --nproc launcher
// (see launch.h and docs/launch.md).
#include "runtime/comm/launch.h"

#include "runtime/base/atomic_file.h"
#include "runtime/comm/collective_record.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <ftw.h>
#include <map>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace mt::rt {

namespace {

// A value and the name it came from ("--rank", "MT_RANK", "SLURM_PROCID").
struct Setting {
  std::string value;
  std::string name;
  bool set() const { return !name.empty(); }
};

Setting from_env(const char *name) {
  const char *v = std::getenv(name);
  return v ? Setting{v, name} : Setting{};
}

// The first of the given settings that is set.
Setting first_of(std::initializer_list<Setting> settings) {
  for (const Setting &s : settings)
    if (s.set())
      return s;
  return {};
}

Setting from_flag(int value, const char *name) {
  return value >= 0 ? Setting{std::to_string(value), name} : Setting{};
}

Setting from_flag(const std::string &value, const char *name) {
  return value.empty() ? Setting{} : Setting{value, name};
}

bool is_digits(const std::string &s) {
  if (s.empty())
    return false;
  for (char c : s)
    if (c < '0' || c > '9')
      return false;
  return true;
}

// Parses a whole number >= 0 that fits an int.
bool parse_count(const Setting &s, int *out, std::string *error) {
  if (!is_digits(s.value) || s.value.size() > 9) {
    *error = s.name + " is '" + s.value + "', expected a whole number >= 0";
    return false;
  }
  *out = std::atoi(s.value.c_str());
  return true;
}

bool is_flag_source(const Setting &s) {
  return s.set() && s.name.rfind("SLURM_", 0) != 0;
}

} // namespace

LaunchInfo launch_from_environment(const LaunchFlags &flags, std::string *error) {
  error->clear();
  auto fail = [&](std::string message) {
    *error = std::move(message);
    return LaunchInfo();
  };

  Setting rank_s = first_of({from_flag(flags.rank, "--rank"), from_env("MT_RANK"),
                             from_env("SLURM_PROCID")});
  Setting world_s = first_of({from_flag(flags.world, "--world-size"),
                              from_env("MT_WORLD_SIZE"), from_env("SLURM_NTASKS")});
  if (!rank_s.set() && !world_s.set())
    return LaunchInfo(); // one rank on its own
  // Mixing a hand-given rank with SLURM's world (or the reverse) is almost
  // always a mistake; ask for both from the same place.
  if (!rank_s.set() || !world_s.set() || is_flag_source(rank_s) != is_flag_source(world_s)) {
    const Setting &given = rank_s.set() && (!world_s.set() || is_flag_source(rank_s)) ? rank_s : world_s;
    const char *missing = &given == &rank_s ? "the world size (--world-size or MT_WORLD_SIZE)"
                                            : "the rank (--rank or MT_RANK)";
    return fail(given.name + " is set but " + missing +
                " is not; give both, or neither and let srun set them");
  }

  LaunchInfo info;
  info.source = is_flag_source(rank_s) ? "flags" : "slurm";
  if (!parse_count(rank_s, &info.rank, error) || !parse_count(world_s, &info.world, error))
    return LaunchInfo();
  if (info.world < 1)
    return fail(world_s.name + " is " + world_s.value + ", expected at least 1");
  if (info.rank >= info.world)
    return fail(rank_s.name + " is " + rank_s.value + ", outside [0, " + world_s.name + "=" +
                world_s.value + ")");

  // The local rank: under SLURM srun always sets SLURM_LOCALID; ranks given
  // by hand are taken to share one machine unless told otherwise.
  Setting local_s = first_of({from_flag(flags.local_rank, "--local-rank"),
                              from_env("MT_LOCAL_RANK"),
                              info.source == "slurm" ? from_env("SLURM_LOCALID") : Setting{}});
  if (local_s.set()) {
    if (!parse_count(local_s, &info.local_rank, error))
      return LaunchInfo();
    if (info.local_rank >= info.world)
      return fail(local_s.name + " is " + local_s.value + ", outside [0, " + world_s.name +
                  "=" + world_s.value + ")");
  } else if (info.source == "slurm") {
    return fail("SLURM_PROCID is set but SLURM_LOCALID is not; start the ranks with srun");
  } else {
    info.local_rank = info.rank;
  }

  // The nodes of this step (informational for hand-given ranks).
  Setting nodelist_s = first_of({from_env("SLURM_STEP_NODELIST"), from_env("SLURM_JOB_NODELIST")});
  if (nodelist_s.set()) {
    std::string nodes_error;
    info.nodes = expand_slurm_nodelist(nodelist_s.value, &nodes_error);
    if (!nodes_error.empty())
      return fail(nodelist_s.name + " '" + nodelist_s.value + "': " + nodes_error);
  } else if (info.source == "slurm") {
    return fail("SLURM_PROCID is set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is; "
                "start the ranks with srun");
  }

  // The job key: unique per run, so concurrent runs never share rendezvous
  // files. Under SLURM, job and step ids (two sruns of one job differ in step).
  Setting job_s = first_of({from_flag(flags.job, "--job"), from_env("MT_JOB")});
  if (job_s.set()) {
    info.job = job_s.value;
  } else if (info.source == "slurm") {
    Setting job_id = first_of({from_env("SLURM_JOB_ID"), from_env("SLURM_JOBID")});
    Setting step_id = first_of({from_env("SLURM_STEP_ID"), from_env("SLURM_STEPID")});
    if (!job_id.set() || !step_id.set())
      return fail(std::string("SLURM_PROCID is set but ") +
                  (job_id.set() ? "SLURM_STEP_ID" : "SLURM_JOB_ID") +
                  " is not; start the ranks with srun (also inside sbatch), or set MT_JOB");
    info.job = job_id.value + "." + step_id.value;
  } else if (info.world > 1) {
    return fail(rank_s.name + " is set but the job name (--job or MT_JOB) is not; give every "
                "rank of one run the same name, and each run its own");
  }
  if (info.job.find('/') != std::string::npos || info.job == "." || info.job == "..")
    return fail(job_s.name + " is '" + info.job + "', which is not a valid file name; use "
                "letters, digits, '.', '-' and '_'");

  // The rendezvous directory: <base>/<job>, base from the flag or
  // MT_RENDEZVOUS_DIR, else (SLURM) the submit directory, which every node of
  // a job normally sees on a shared file system.
  Setting base_s = first_of({from_flag(flags.rendezvous_dir, "--rendezvous-dir"),
                             from_env("MT_RENDEZVOUS_DIR")});
  std::string base = base_s.value;
  if (!base_s.set() && info.source == "slurm") {
    Setting submit = from_env("SLURM_SUBMIT_DIR");
    if (!submit.set())
      return fail("SLURM_SUBMIT_DIR is not set; set MT_RENDEZVOUS_DIR to a directory every "
                  "node of the job can write");
    base = submit.value + "/.mt-rendezvous";
  }
  if (base.empty() && info.world > 1)
    return fail(rank_s.name + " is set but the rendezvous directory (--rendezvous-dir or "
                "MT_RENDEZVOUS_DIR) is not; give every rank the same directory");
  if (!base.empty()) {
    info.rendezvous_base = base;
    info.rendezvous_dir = base + "/" + info.job;
  }

  // The address the other ranks connect to: loopback when the whole run is
  // on this machine, else this host's name as the cluster resolves it.
  Setting host_s = from_env("MT_HOSTNAME");
  if (host_s.set() && !host_s.value.empty()) {
    info.hostname = host_s.value;
  } else if (info.nodes.size() > 1) {
    char name[HOST_NAME_MAX + 1] = {};
    if (::gethostname(name, sizeof name - 1) != 0)
      return fail(std::string("cannot read this machine's host name: ") + std::strerror(errno) +
                  "; set MT_HOSTNAME to the address the other ranks should connect to");
    info.hostname = name;
  }
  return info;
}

namespace {

// Splits at commas outside brackets.
bool split_top_level(const std::string &s, std::vector<std::string> *items, std::string *error) {
  int depth = 0;
  std::string current;
  for (char c : s) {
    if (c == '[') {
      if (++depth > 1) {
        *error = "nested '[' in '" + s + "'";
        return false;
      }
    } else if (c == ']') {
      if (--depth < 0) {
        *error = "']' without '[' in '" + s + "'";
        return false;
      }
    }
    if (c == ',' && depth == 0) {
      items->push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) {
    *error = "'[' without ']' in '" + s + "'";
    return false;
  }
  items->push_back(current);
  return true;
}

constexpr size_t kMaxHosts = size_t(1) << 20;

// "01-03,07" -> {"01", "02", "03", "07"}.
bool expand_ranges(const std::string &body, std::vector<std::string> *out, std::string *error) {
  if (body.empty()) {
    *error = "empty brackets '[]'";
    return false;
  }
  size_t start = 0;
  while (true) {
    size_t comma = body.find(',', start);
    std::string piece = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = piece.find('-');
    std::string lo_s = piece.substr(0, dash);
    std::string hi_s = dash == std::string::npos ? lo_s : piece.substr(dash + 1);
    if (!is_digits(lo_s) || !is_digits(hi_s) || lo_s.size() > 18 || hi_s.size() > 18) {
      *error = "'" + piece + "' in '[" + body + "]' is not a number or a range like 01-03";
      return false;
    }
    unsigned long long lo = std::strtoull(lo_s.c_str(), nullptr, 10);
    unsigned long long hi = std::strtoull(hi_s.c_str(), nullptr, 10);
    if (lo > hi) {
      *error = "range '" + piece + "' in '[" + body + "]' runs backwards";
      return false;
    }
    if (hi - lo >= kMaxHosts || out->size() + (hi - lo) >= kMaxHosts) {
      *error = "'[" + body + "]' names more than " + std::to_string(kMaxHosts) + " hosts";
      return false;
    }
    // The lower bound's width is kept: "08-10" gives 08, 09, 10.
    int width = static_cast<int>(lo_s.size());
    for (unsigned long long v = lo; v <= hi; ++v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%0*llu", width, v);
      out->push_back(buf);
    }
    if (comma == std::string::npos)
      return true;
    start = comma + 1;
  }
}

} // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string &nodelist, std::string *error) {
  error->clear();
  std::vector<std::string> hosts;
  if (nodelist.empty()) {
    *error = "empty node list";
    return {};
  }
  std::vector<std::string> items;
  if (!split_top_level(nodelist, &items, error))
    return {};
  for (const std::string &item : items) {
    if (item.empty()) {
      *error = "empty host name in '" + nodelist + "'";
      return {};
    }
    // Every combination of the item's parts, left to right.
    std::vector<std::string> expanded{""};
    size_t pos = 0;
    while (pos < item.size()) {
      std::vector<std::string> part;
      if (item[pos] == '[') {
        size_t close = item.find(']', pos);
        if (!expand_ranges(item.substr(pos + 1, close - pos - 1), &part, error))
          return {};
        pos = close + 1;
      } else {
        size_t open = item.find('[', pos);
        part.push_back(item.substr(pos, open == std::string::npos ? std::string::npos : open - pos));
        pos = open == std::string::npos ? item.size() : open;
      }
      if (expanded.size() * part.size() + hosts.size() > kMaxHosts) {
        *error = "'" + item + "' names more than " + std::to_string(kMaxHosts) + " hosts";
        return {};
      }
      std::vector<std::string> next;
      next.reserve(expanded.size() * part.size());
      for (const std::string &prefix : expanded)
        for (const std::string &p : part)
          next.push_back(prefix + p);
      expanded.swap(next);
    }
    hosts.insert(hosts.end(), expanded.begin(), expanded.end());
  }
  return hosts;
}

namespace {

std::string make_dirs(const std::string &path) {
  std::string failed;
  int e = 0;
  if (make_directories(path, &failed, &e))
    return "";
  if (e == ENOTDIR && failed == path)
    return "the rendezvous directory '" + path + "' is not a directory; set MT_RENDEZVOUS_DIR "
           "to a directory every rank can write";
  return "cannot create the rendezvous directory '" + failed + "': " + std::strerror(e) +
         "; set MT_RENDEZVOUS_DIR to a directory every rank can write";
}

int remove_entry(const char *path, const struct stat *, int, struct FTW *) {
  return ::remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

std::string remove_tree(const std::string &path) {
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
    return "cannot remove '" + path + "': " + std::strerror(errno);
  return "";
}

} // namespace

std::string prepare_rendezvous_dir(const LaunchInfo &info) {
  if (info.rendezvous_dir.empty())
    return "no rendezvous directory for rank " + std::to_string(info.rank) +
           "; set MT_RENDEZVOUS_DIR";
  return make_dirs(info.rendezvous_dir);
}

std::string remove_rendezvous_dir(const LaunchInfo &info) {
  if (info.rendezvous_dir.empty())
    return "";
  return remove_tree(info.rendezvous_dir);
}

namespace {

struct Stream {
  int fd = -1;
  FILE *to = nullptr;
  std::string pending; // a partial line
};

struct Child {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
};

void write_prefixed(Stream &s, int rank, const char *data, size_t n, bool prefix) {
  if (!prefix) {
    std::fwrite(data, 1, n, s.to);
    std::fflush(s.to);
    return;
  }
  s.pending.append(data, n);
  size_t start = 0, nl;
  while ((nl = s.pending.find('\n', start)) != std::string::npos) {
    std::fprintf(s.to, "[rank %d] %.*s\n", rank, int(nl - start), s.pending.data() + start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  std::fflush(s.to);
}

// Reads what is there; closes the stream at end of file.
void drain(Stream &s, int rank, bool prefix) {
  char buf[4096];
  ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n > 0) {
    write_prefixed(s, rank, buf, static_cast<size_t>(n), prefix);
    return;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return;
  if (!s.pending.empty())
    write_prefixed(s, rank, "\n", 1, prefix);
  ::close(s.fd);
  s.fd = -1;
}

std::string describe(int status) {
  if (WIFEXITED(status))
    return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

int exit_code(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status) ? WEXITSTATUS(status) : 1;
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return 1;
}

bool is_launch_variable(const char *entry) {
  for (const char *name : {"MT_RANK=", "MT_WORLD_SIZE=", "MT_LOCAL_RANK=", "MT_RENDEZVOUS_DIR=", "MT_JOB="})
    if (std::strncmp(entry, name, std::strlen(name)) == 0)
      return true;
  return false;
}

using Clock = std::chrono::steady_clock;

} // namespace

namespace {
volatile std::sig_atomic_t g_forward_signal = 0;
extern "C" void on_forward_signal(int sig) { g_forward_signal = sig; }
} // namespace

void unblock_stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
}

int run_local_ranks(int nproc, const std::vector<std::string> &argv, const LocalRunOptions &options) {
  const char *tool = options.tool.c_str();
  if (nproc < 1) {
    std::fprintf(stderr, "%s: --nproc is %d, expected at least 1\n", tool, nproc);
    return 2;
  }
  if (argv.empty()) {
    std::fprintf(stderr, "%s: no command to run on each rank\n", tool);
    return 2;
  }

  // A fresh base directory per launch: nothing of an earlier run is read.
  const char *tmp = std::getenv("TMPDIR");
  std::string base = std::string(tmp && *tmp ? tmp : "/tmp") + "/mt-rendezvous.XXXXXX";
  if (!::mkdtemp(base.data())) {
    std::fprintf(stderr, "%s: cannot create a rendezvous directory '%s': %s; set TMPDIR to a "
                 "writable directory\n", tool, base.c_str(), std::strerror(errno));
    return 1;
  }
  std::string job = "local." + std::to_string(::getpid());

  // Everything exec needs is built before fork (the parent may have threads).
  std::vector<char *> args;
  for (const std::string &a : argv)
    args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> inherited;
  for (char **e = environ; *e; ++e)
    if (!is_launch_variable(*e))
      inherited.push_back(*e);
  // N ranks share this machine's cores: unless the user chose, each rank's
  // BLAS and OpenMP get an equal share (at least one thread), as torchrun
  // sets OMP_NUM_THREADS, instead of every rank starting a thread per core.
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  const std::string share = std::to_string(std::max(1L, cores / nproc));
  for (const char *name : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"})
    if (!std::getenv(name))
      inherited.push_back(std::string(name) + "=" + share);

  // SIGTERM or SIGINT to the launcher (scancel, a time limit, Ctrl-C) is
  // passed on to every rank, which then saves and stops on its own. The
  // handler is in place before the first rank starts, so a signal that
  // arrives while the ranks start reaches them too (the loop below passes
  // it on to every rank started).
  g_forward_signal = 0;
  struct sigaction forward {}, old_term {}, old_int {};
  forward.sa_handler = on_forward_signal;
  sigemptyset(&forward.sa_mask);
  ::sigaction(SIGTERM, &forward, &old_term);
  ::sigaction(SIGINT, &forward, &old_int);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);

  std::vector<Child> children(nproc);
  std::fflush(stdout);
  std::fflush(stderr);
  int started = 0;
  std::string start_error;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env_strings = inherited;
    env_strings.push_back("MT_RANK=" + std::to_string(r));
    env_strings.push_back("MT_WORLD_SIZE=" + std::to_string(nproc));
    env_strings.push_back("MT_LOCAL_RANK=" + std::to_string(r));
    env_strings.push_back("MT_RENDEZVOUS_DIR=" + base);
    env_strings.push_back("MT_JOB=" + job);
    std::vector<char *> env;
    for (std::string &s : env_strings)
      env.push_back(s.data());
    env.push_back(nullptr);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (options.prefix_output &&
        (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0)) {
      start_error = std::string("cannot create a pipe: ") + std::strerror(errno);
      break;
    }
    const pid_t launcher = ::getpid();
    // The stop signals are blocked over the fork: the rank starts with the
    // default actions (not the launcher's handler), and one that arrives
    // meanwhile waits for them.
    sigset_t unblocked;
    ::pthread_sigmask(SIG_BLOCK, &stop_signals, &unblocked);
    pid_t pid = ::fork();
    if (pid != 0)
      ::pthread_sigmask(SIG_SETMASK, &unblocked, nullptr);
    if (pid < 0) {
      start_error = std::string("cannot start rank ") + std::to_string(r) + ": " + std::strerror(errno);
      break;
    }
    if (pid == 0) {
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      // A rank ends with its launcher, however the launcher ends (SIGKILL
      // included): the kernel sends it SIGKILL then. A launcher that died
      // before this call would go unnoticed, so the parent is checked after.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher)
        ::_exit(1);
      if (options.prefix_output) {
        ::dup2(out_pipe[1], STDOUT_FILENO);
        ::dup2(err_pipe[1], STDERR_FILENO);
      }
      // The stop signals stay blocked across exec with block_stop_signals
      // (the rank unblocks them once its handler is set), else a pending
      // one acts now.
      if (!options.block_stop_signals)
        ::sigprocmask(SIG_SETMASK, &unblocked, nullptr);
      ::execvpe(args[0], args.data(), env.data());
      const char *why = std::strerror(errno);
      std::string line = std::string(tool) + ": cannot run '" + argv[0] + "': " + why + "\n";
      ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
      (void)ignored;
      ::_exit(127);
    }
    Child &c = children[r];
    c.pid = pid;
    c.running = true;
    c.out.to = stdout;
    c.err.to = stderr;
    if (options.prefix_output) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      c.out.fd = out_pipe[0];
      c.err.fd = err_pipe[0];
    }
    ++started;
  }

  int failed_rank = -1;
  int failed_status = 0;
  // The ranks that failed ranks named as the cause (a rank that never
  // entered the collective they timed out in, a rank that exited under
  // them), from their blame files: the first failure to exit is often not
  // the cause (a survivor of a hung rank exits at its timeout while the
  // hung rank never exits; a peer that notices a crash can be reaped in
  // the same sweep as the crashed rank).
  const std::string records = record_dir(base + "/" + job);
  std::map<int, Suspect> blamed;
  std::map<int, int> blamed_by;
  // Hung ranks are stopped at once (SIGTERM, SIGKILL 2 s later: a stopped
  // process leaves SIGTERM pending); the others keep their grace period.
  std::vector<int> hung_ranks;
  Clock::time_point hung_kill_at = Clock::time_point::max();
  Clock::time_point term_at = Clock::time_point::max(), kill_at;
  bool term_sent = false, kill_sent = false;
  std::vector<int> stopped;
  if (!start_error.empty()) {
    std::fprintf(stderr, "%s: %s; stopping the ranks already started\n", tool, start_error.c_str());
    term_at = Clock::now();
  }

  auto any_running = [&] {
    for (const Child &c : children)
      if (c.running)
        return true;
    return false;
  };
  bool forwarded = false;
  Clock::time_point drain_until = Clock::time_point::max();
  while (true) {
    if (g_forward_signal && !forwarded) {
      for (int r = 0; r < started; ++r)
        if (children[r].running)
          ::kill(children[r].pid, int(g_forward_signal));
      forwarded = true;
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<int, Stream *>> owners;
    for (int r = 0; r < started; ++r)
      for (Stream *s : {&children[r].out, &children[r].err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({r, s});
        }
    bool running = any_running();
    if (!running) {
      // Output left in the pipes is still copied, unless something the ranks
      // started keeps a pipe open.
      if (drain_until == Clock::time_point::max())
        drain_until = Clock::now() + std::chrono::seconds(1);
      if (fds.empty() || Clock::now() > drain_until)
        break;
    }
    if (!fds.empty()) {
      if (::poll(fds.data(), fds.size(), 50) > 0)
        for (size_t i = 0; i < fds.size(); ++i)
          if (fds[i].revents)
            drain(*owners[i].second, owners[i].first, options.prefix_output);
    } else {
      ::usleep(50 * 1000);
    }

    // Every rank that ended is reaped before any is judged: a rank that a
    // failed one names as the cause may have ended in the same sweep.
    std::vector<int> ended;
    for (int r = 0; r < started; ++r) {
      Child &c = children[r];
      if (!c.running)
        continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid)
        continue;
      c.running = false;
      c.status = status;
      ended.push_back(r);
    }
    for (int r : ended) {
      const int status = children[r].status;
      if (status == 0 || !start_error.empty() ||
          std::find(stopped.begin(), stopped.end(), r) != stopped.end())
        continue;
      std::string hung; // ranks it names that are still running
      for (Suspect &s : read_blame(records, r))
        if (s.rank != r && s.rank >= 0 && s.rank < started && !blamed.count(s.rank)) {
          blamed_by[s.rank] = r;
          if (children[s.rank].running) {
            hung += (hung.empty() ? "" : ", ") + std::to_string(s.rank);
            ::kill(children[s.rank].pid, SIGTERM);
            stopped.push_back(s.rank);
            hung_ranks.push_back(s.rank);
            hung_kill_at = Clock::now() + std::chrono::seconds(2);
          }
          blamed.emplace(s.rank, std::move(s));
        }
      if (!hung.empty())
        // Waiting for a rank its peers saw hang would only add the grace period.
        std::fprintf(stderr, "%s: rank %d %s after naming rank(s) %s as hung; stopping %s\n",
                     tool, r, describe(status).c_str(), hung.c_str(),
                     hung.find(',') == std::string::npos ? "it" : "them");
      if (failed_rank < 0) {
        failed_rank = r;
        failed_status = status;
        term_at = Clock::now() + options.grace;
        if (any_running() && hung.empty())
          std::fprintf(stderr, "%s: rank %d %s; waiting up to %.1f s for the other ranks to stop\n",
                       tool, r, describe(status).c_str(), options.grace.count() / 1000.0);
      }
    }

    Clock::time_point now = Clock::now();
    if (now >= hung_kill_at) {
      for (int r : hung_ranks)
        if (children[r].running)
          ::kill(children[r].pid, SIGKILL);
      hung_kill_at = Clock::time_point::max();
    }
    if (now >= term_at && !term_sent) {
      term_sent = true; // once: ranks blamed later are stopped with the rest
      for (int r = 0; r < started; ++r)
        if (children[r].running &&
            std::find(hung_ranks.begin(), hung_ranks.end(), r) == hung_ranks.end()) {
          ::kill(children[r].pid, SIGTERM);
          stopped.push_back(r);
        }
      kill_at = now + std::chrono::seconds(2);
    }
    if (term_sent && !kill_sent && now >= kill_at) {
      for (int r = 0; r < started; ++r)
        if (children[r].running)
          ::kill(children[r].pid, SIGKILL);
      kill_sent = true;
    }
  }
  for (Child &c : children)
    for (Stream *s : {&c.out, &c.err})
      if (s->fd >= 0)
        ::close(s->fd);
  remove_tree(base);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGINT, &old_int, nullptr);

  if (!start_error.empty())
    return 1;
  if (failed_rank < 0)
    return 0;
  std::string stopped_list;
  for (int r : stopped)
    stopped_list += (stopped_list.empty() ? "" : ", ") + std::to_string(r);
  const std::string stopped_phrase =
      stopped_list.empty() ? "" : "; stopped rank(s) " + stopped_list + " that were still running";
  if (blamed.empty()) {
    std::fprintf(stderr, "%s: rank %d of %d failed: it %s%s; see its output above\n", tool,
                 failed_rank, nproc, describe(failed_status).c_str(), stopped_phrase.c_str());
    return exit_code(failed_status);
  }
  // One line per rank named as the cause, with what its peers saw.
  int code = exit_code(failed_status);
  for (const auto &[b, suspect] : blamed) {
    const Child &c = children[b];
    const int by = blamed_by[b];
    const bool was_stopped = std::find(stopped.begin(), stopped.end(), b) != stopped.end();
    const std::string named = "named by rank " + std::to_string(by) + ", which " +
                              describe(children[by].status);
    if (was_stopped) {
      std::fprintf(stderr, "%s: rank %d of %d hung: %s; %s%s\n", tool, b, nproc,
                   suspect.line.c_str(), named.c_str(), stopped_phrase.c_str());
    } else if (c.status != 0) {
      std::fprintf(stderr, "%s: rank %d of %d failed: it %s; %s; %s\n", tool, b, nproc,
                   describe(c.status).c_str(), suspect.line.c_str(), named.c_str());
      code = exit_code(c.status);
    } else {
      std::fprintf(stderr, "%s: rank %d of %d exited with status 0 before the others were "
                   "done: %s; %s\n", tool, b, nproc, suspect.line.c_str(), named.c_str());
    }
  }
  return code;
}

} // namespace mt::rt
