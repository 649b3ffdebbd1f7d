// What the process is doing now, and the line for an escaped exception
// (see activity.h).
#include "runtime/base/activity.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <mutex>
#include <new>
#include <stdexcept>
#include <sys/resource.h>

namespace mt::rt {

namespace {
std::mutex g_mutex;
Activity g_activity{"starting", 0, ""};
std::string g_speaker;

// A "Name:   N kB" line of a /proc file, in bytes; 0 when absent.
uint64_t proc_kb(const char *file, const std::string &name) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + ":", 0) == 0)
      return std::strtoull(line.c_str() + name.size() + 1, nullptr, 10) * 1024;
  return 0;
}
} // namespace

std::string bytes_text(uint64_t n) {
  char buf[64];
  if (n >= (uint64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(n) / double(uint64_t(1) << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(1 << 20));
  return buf;
}

std::string host_memory_limits(bool *limited) {
  std::string text;
  rlimit limit{};
  const bool capped = getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  if (capped)
    text = "this process may map at most " + bytes_text(limit.rlim_cur) + " (ulimit -v) and maps " +
           bytes_text(proc_kb("/proc/self/status", "VmSize"));
  if (uint64_t avail = proc_kb("/proc/meminfo", "MemAvailable"))
    text += (text.empty() ? "" : "; ") + std::string("the machine has ") + bytes_text(avail) +
            " available";
  if (limited)
    *limited = capped;
  return text;
}

void set_activity_speaker(const std::string &speaker) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_speaker = speaker;
}

std::string activity_speaker() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_speaker;
}

void set_activity(const std::string &what, uint64_t bytes, const std::string &source) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_activity.what = what;
    g_activity.bytes = bytes;
    g_activity.source = source;
  }
#ifdef MT_TEST_HOOKS
  // The test hook (activity.h): a failed allocation at a known step.
  static const char *fail_at = std::getenv("MT_TEST_BAD_ALLOC_AT");
  if (fail_at && *fail_at && what.rfind(fail_at, 0) == 0) {
    std::fprintf(stderr, "test hook MT_TEST_BAD_ALLOC_AT='%s': std::bad_alloc while %s\n",
                 fail_at, what.c_str());
    throw std::bad_alloc();
  }
#endif
}

Activity current_activity() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_activity;
}

ActivityScope::ActivityScope(const std::string &what, uint64_t bytes, const std::string &source)
    : saved_(current_activity()) {
  set_activity(what, bytes, source);
}

ActivityScope::~ActivityScope() { set_activity(saved_.what, saved_.bytes, saved_.source); }

std::string describe_escaped_exception() {
  const Activity a = current_activity();
  const std::string speaker = activity_speaker();
  try {
    throw;
  } catch (const std::bad_alloc &) {
    std::string line = speaker + "out of memory while " + a.what +
                       ": a host allocation failed (std::bad_alloc)";
    if (a.bytes > 0)
      line += "; this step needs at least " + std::to_string(a.bytes) + " bytes (" + bytes_text(a.bytes) +
              (a.source.empty() ? "" : ", " + a.source) + ")";
    bool limited = false;
    if (std::string limits = host_memory_limits(&limited); !limits.empty())
      line += "; " + limits;
    return line + (limited ? "; raise the limit" : "; free memory on this machine") +
           ", or compile a smaller model or one for more ranks";
  } catch (const std::exception &e) {
    return speaker + "internal error: an exception escaped while " + a.what + ": " + e.what() +
           "; please report it with the command line";
  } catch (...) {
    return speaker + "internal error: an exception of unknown type escaped while " + a.what +
           "; please report it with the command line";
  }
}

} // namespace mt::rt
