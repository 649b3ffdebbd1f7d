// OpenBLAS's work buffers, taken before the plan's buffers (see cpu_blas.cpp).
#ifndef MT_RUNTIME_EXEC_CPU_BLAS_H
#define MT_RUNTIME_EXEC_CPU_BLAS_H

#include <string>

namespace mt::rt {

// Runs one GEMM on every OpenBLAS thread, once per process, so that the
// library takes its work buffers before the executor allocates the plan's.
// OpenBLAS retries a failed buffer allocation for ever (and ignores
// SIGTERM meanwhile), so under an address-space limit (ulimit -v) too
// small for them mtrun would hang at its first GEMM. Returns "" when
// ready, or the error: with a limit set, the buffers are first tried with
// plain allocations of the same size, which fail instead of hanging; a
// GEMM that still does not return within a minute ends the process with
// the same error (exit 1), since the thread running it never comes back.
std::string prepare_blas(const std::string &who);

} // namespace mt::rt

#endif // MT_RUNTIME_EXEC_CPU_BLAS_H
