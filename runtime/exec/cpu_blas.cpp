// OpenBLAS's work buffers, taken before the plan's buffers (cpu_blas.h).
#include "runtime/exec/cpu_blas.h"

#include "runtime/base/activity.h"

#include <cblas.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <vector>

namespace mt::rt {

namespace {

// The size of one OpenBLAS work buffer in Debian's and the default builds
// (BUFFER_SIZE, 128 MiB on x86-64, plus a page), taken per thread that
// runs a GEMM.
constexpr size_t kBufferBytes = (size_t(128) << 20) + 4096;

// What starting OpenBLAS's threads maps besides: a stack (8 MiB) and a
// malloc arena (64 MiB of address space) for each.
constexpr size_t kThreadBytes = size_t(72) << 20;

std::string blas_error(const std::string &who, int threads) {
  return who + "the BLAS library (OpenBLAS, " + std::to_string(threads) +
         (threads == 1 ? " thread" : " threads") + ") cannot allocate its work buffers (" +
         bytes_text(kBufferBytes * size_t(threads) + kThreadBytes) +
         ", 128 MiB a thread and room to start them): " +
         host_memory_limits() + "; raise the limit (ulimit -v) by that much, or set "
         "OPENBLAS_NUM_THREADS lower";
}

// One GEMM large enough for OpenBLAS to split over all its threads.
void run_gemm() {
  constexpr int n = 512;
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 1.0f), c(size_t(n) * n, 0.0f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
              n, 0.0f, c.data(), n);
}

} // namespace

std::string prepare_blas(const std::string &who) {
  static std::once_flag once;
  static std::string result;
  std::call_once(once, [&] {
    const int threads = std::max(1, openblas_get_num_threads());
    bool limited = false;
    host_memory_limits(&limited);
    if (limited) {
      // The same allocations OpenBLAS makes, which fail here instead of
      // being retried for ever.
      std::vector<void *> probes;
      bool ok = true;
      for (int t = 0; t <= threads && ok; ++t) {
        // A buffer per thread, and the room a new thread's stack and
        // malloc arena reserve.
        void *p = std::malloc(t < threads ? kBufferBytes : kThreadBytes);
        ok = p != nullptr;
        if (p)
          probes.push_back(p);
      }
      for (void *p : probes)
        std::free(p);
      if (!ok) {
        result = blas_error(who, threads);
        return;
      }
    }
    try {
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      std::thread watchdog([&] {
        std::unique_lock<std::mutex> lock(m);
        if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; })) {
          const std::string line = "mtrun: error: " + blas_error(who, threads) + "\n";
          (void)!write(2, line.data(), line.size());
          _exit(1);
        }
      });
      run_gemm();
      {
        std::lock_guard<std::mutex> lock(m);
        done = true;
      }
      cv.notify_one();
      watchdog.join();
    } catch (const std::system_error &) { // no thread for the watchdog
      result = blas_error(who, threads);
    } catch (const std::bad_alloc &) { // not even the GEMM's operands
      result = blas_error(who, threads);
    }
  });
  return result;
}

} // namespace mt::rt
