// runtime/exec/cuda/cuda_api.h declares CUDA's types and entry points itself; this
// file checks every function pointer there against the toolkit's own
// headers (cuda.h, nvrtc.h, cublasLt.h, nccl.h), so a wrong parameter is a
// compile error here, not memory corruption on a GPU. Built only where the
// headers were found at configure time; elsewhere one test says it skipped.
#include "runtime/exec/cuda/cuda_api.h"

#include <gtest/gtest.h>

#ifndef MT_NO_CUDA_HEADERS

#include <type_traits>

// Our member types, named before cuda.h's macros rename cuMemAlloc and
// friends to their _v2 forms.
namespace mine {
#define MT_MEMBER(table, name) using name##_ours = decltype(mt::cu::table::name);
#define MT_DRIVER(X)                                                                             \
  X(Driver, cuInit) X(Driver, cuDriverGetVersion) X(Driver, cuGetErrorName)                      \
  X(Driver, cuGetErrorString) X(Driver, cuDeviceGetCount) X(Driver, cuDeviceGet)                 \
  X(Driver, cuDeviceGetName) X(Driver, cuDeviceGetAttribute) X(Driver, cuDeviceTotalMem)         \
  X(Driver, cuDevicePrimaryCtxRetain) X(Driver, cuDevicePrimaryCtxRelease)                       \
  X(Driver, cuCtxSetCurrent) X(Driver, cuCtxSynchronize) X(Driver, cuMemGetInfo)                 \
  X(Driver, cuMemAlloc) X(Driver, cuMemFree) X(Driver, cuMemcpyHtoD) X(Driver, cuMemcpyDtoH)     \
  X(Driver, cuMemcpyHtoDAsync) X(Driver, cuMemcpyDtoHAsync) X(Driver, cuMemcpyDtoDAsync)         \
  X(Driver, cuMemsetD8Async)                                                                     \
  X(Driver, cuModuleLoadData) X(Driver, cuModuleUnload) X(Driver, cuModuleGetFunction)           \
  X(Driver, cuFuncGetAttribute) X(Driver, cuFuncSetAttribute)                                   \
  X(Driver, cuLaunchKernel) X(Driver, cuStreamCreate) X(Driver, cuStreamDestroy)                 \
  X(Driver, cuStreamSynchronize) X(Driver, cuStreamQuery) X(Driver, cuStreamWaitEvent)          \
  X(Driver, cuEventCreate) X(Driver, cuEventDestroy) X(Driver, cuEventRecord)                    \
  X(Driver, cuEventQuery)                                                                         \
  X(Driver, cuStreamBeginCapture) X(Driver, cuStreamEndCapture)                                  \
  X(Driver, cuGraphInstantiate) X(Driver, cuGraphLaunch) X(Driver, cuGraphExecDestroy)           \
  X(Driver, cuGraphDestroy)
MT_DRIVER(MT_MEMBER)
} // namespace mine

#include <cublasLt.h>
#include <cuda.h>
#include <nccl.h>
#include <nvrtc.h>

namespace {
namespace cu = mt::cu;

// Two signatures agree when they do after this normalisation: integers and
// enums become their size (CUresult is an enum in cuda.h and an int here;
// the ABI passes both alike), const and volatile are dropped, and mt's opaque structs
// become the headers' ones.
template <size_t N> struct Int {};
template <typename T, typename = void> struct Norm { using type = T; };
template <typename T> using norm_t = typename Norm<std::remove_cv_t<T>>::type;
template <typename T>
struct Norm<T, std::enable_if_t<std::is_integral_v<T> || std::is_enum_v<T>>> {
  using type = Int<sizeof(T)>;
};
template <typename T> struct Norm<T *, void> { using type = norm_t<T> *; };
template <typename R, typename... A> struct Norm<R (*)(A...), void> {
  using type = norm_t<R> (*)(norm_t<A>...);
};
#define MT_SAME_STRUCT(ours, theirs)                                                             \
  template <> struct Norm<ours, void> { using type = theirs; };
MT_SAME_STRUCT(cu::CUctx_st, ::CUctx_st)
MT_SAME_STRUCT(cu::CUmod_st, ::CUmod_st)
MT_SAME_STRUCT(cu::CUfunc_st, ::CUfunc_st)
MT_SAME_STRUCT(cu::CUstream_st, ::CUstream_st)
MT_SAME_STRUCT(cu::CUevent_st, ::CUevent_st)
MT_SAME_STRUCT(cu::CUgraph_st, ::CUgraph_st)
MT_SAME_STRUCT(cu::CUgraphExec_st, ::CUgraphExec_st)
MT_SAME_STRUCT(cu::_nvrtcProgram, ::_nvrtcProgram)
MT_SAME_STRUCT(cu::cublasLtContext, ::cublasLtContext)
MT_SAME_STRUCT(cu::cublasLtMatmulDescOpaque_t, ::cublasLtMatmulDescOpaque_t)
MT_SAME_STRUCT(cu::cublasLtMatrixLayoutOpaque_t, ::cublasLtMatrixLayoutOpaque_t)
MT_SAME_STRUCT(cu::cublasLtMatmulPreferenceOpaque_t, ::cublasLtMatmulPreferenceOpaque_t)
MT_SAME_STRUCT(cu::cublasLtMatmulAlgo_t, ::cublasLtMatmulAlgo_t)
MT_SAME_STRUCT(cu::cublasLtMatmulHeuristicResult_t, ::cublasLtMatmulHeuristicResult_t)
MT_SAME_STRUCT(cu::ncclComm, ::ncclComm)
MT_SAME_STRUCT(cu::ncclUniqueId, ::ncclUniqueId)

template <typename Ours, typename Theirs> constexpr bool same_abi =
    std::is_same_v<norm_t<Ours>, norm_t<Theirs>>;

// Driver entry points by the ABI name cuda.h's macros resolve to.
#define MT_CHECK_DRIVER(table, name)                                                             \
  static_assert(same_abi<mine::name##_ours, decltype(&::name)>, #name " differs from cuda.h");
MT_DRIVER(MT_CHECK_DRIVER)
#define MT_CHECK(table, name)                                                                    \
  static_assert(same_abi<decltype(cu::table::name), decltype(&::name)>,                         \
                #name " differs from the CUDA headers");
MT_CHECK(Nvrtc, nvrtcGetErrorString) MT_CHECK(Nvrtc, nvrtcVersion)
MT_CHECK(Nvrtc, nvrtcGetNumSupportedArchs) MT_CHECK(Nvrtc, nvrtcGetSupportedArchs)
MT_CHECK(Nvrtc, nvrtcCreateProgram) MT_CHECK(Nvrtc, nvrtcDestroyProgram)
MT_CHECK(Nvrtc, nvrtcCompileProgram) MT_CHECK(Nvrtc, nvrtcGetCUBINSize)
MT_CHECK(Nvrtc, nvrtcGetCUBIN) MT_CHECK(Nvrtc, nvrtcGetPTXSize) MT_CHECK(Nvrtc, nvrtcGetPTX)
MT_CHECK(Nvrtc, nvrtcGetProgramLogSize) MT_CHECK(Nvrtc, nvrtcGetProgramLog)
MT_CHECK(CublasLt, cublasLtGetVersion) MT_CHECK(CublasLt, cublasLtCreate)
MT_CHECK(CublasLt, cublasLtDestroy) MT_CHECK(CublasLt, cublasLtMatmulDescCreate)
MT_CHECK(CublasLt, cublasLtMatmulDescDestroy) MT_CHECK(CublasLt, cublasLtMatmulDescSetAttribute)
MT_CHECK(CublasLt, cublasLtMatrixLayoutCreate) MT_CHECK(CublasLt, cublasLtMatrixLayoutDestroy)
MT_CHECK(CublasLt, cublasLtMatmulPreferenceCreate)
MT_CHECK(CublasLt, cublasLtMatmulPreferenceDestroy)
MT_CHECK(CublasLt, cublasLtMatmulPreferenceSetAttribute)
MT_CHECK(CublasLt, cublasLtMatmulAlgoGetHeuristic) MT_CHECK(CublasLt, cublasLtMatmul)
MT_CHECK(Nccl, ncclGetVersion) MT_CHECK(Nccl, ncclGetErrorString) MT_CHECK(Nccl, ncclGetUniqueId)
MT_CHECK(Nccl, ncclCommInitRank) MT_CHECK(Nccl, ncclCommDestroy) MT_CHECK(Nccl, ncclCommAbort)
MT_CHECK(Nccl, ncclCommGetAsyncError) MT_CHECK(Nccl, ncclGroupStart) MT_CHECK(Nccl, ncclGroupEnd)
MT_CHECK(Nccl, ncclAllReduce) MT_CHECK(Nccl, ncclAllGather) MT_CHECK(Nccl, ncclReduceScatter)
MT_CHECK(Nccl, ncclBroadcast) MT_CHECK(Nccl, ncclSend) MT_CHECK(Nccl, ncclRecv)
MT_CHECK(Nccl, ncclRedOpCreatePreMulSum) MT_CHECK(Nccl, ncclRedOpDestroy)
MT_CHECK(Nccl, ncclReduce)

// Structs passed by value or filled in by the library.
static_assert(sizeof(cu::ncclUniqueId) == sizeof(::ncclUniqueId));
static_assert(sizeof(cu::cublasLtMatmulAlgo_t) == sizeof(::cublasLtMatmulAlgo_t));
static_assert(sizeof(cu::cublasLtMatmulHeuristicResult_t) ==
              sizeof(::cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(cu::cublasLtMatmulHeuristicResult_t, workspaceSize) ==
              offsetof(::cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(cu::cublasLtMatmulHeuristicResult_t, state) ==
              offsetof(::cublasLtMatmulHeuristicResult_t, state));
static_assert(offsetof(cu::cublasLtMatmulHeuristicResult_t, wavesCount) ==
              offsetof(::cublasLtMatmulHeuristicResult_t, wavesCount));

// The enum values mt declares.
static_assert(cu::CUDA_SUCCESS == ::CUDA_SUCCESS);
static_assert(cu::CUDA_ERROR_NO_DEVICE == ::CUDA_ERROR_NO_DEVICE);
static_assert(cu::CUDA_ERROR_STUB_LIBRARY == ::CUDA_ERROR_STUB_LIBRARY);
static_assert(cu::CUDA_ERROR_NOT_READY == ::CUDA_ERROR_NOT_READY);
static_assert(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ==
              ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ==
              ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(cu::CU_STREAM_NON_BLOCKING == ::CU_STREAM_NON_BLOCKING);
static_assert(cu::CU_EVENT_DISABLE_TIMING == ::CU_EVENT_DISABLE_TIMING);
static_assert(cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL == ::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
static_assert(cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES ==
              ::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(cu::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ==
              ::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
static_assert(cu::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES == ::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
static_assert(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK ==
              ::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
static_assert(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ==
              ::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
static_assert(cu::NVRTC_SUCCESS == ::NVRTC_SUCCESS);
static_assert(cu::NVRTC_ERROR_COMPILATION == ::NVRTC_ERROR_COMPILATION);
static_assert(cu::CUBLAS_COMPUTE_32F == ::CUBLAS_COMPUTE_32F &&
              cu::CUBLAS_COMPUTE_64F == ::CUBLAS_COMPUTE_64F);
static_assert(cu::CUDA_R_32F == ::CUDA_R_32F && cu::CUDA_R_64F == ::CUDA_R_64F &&
              cu::CUDA_R_16F == ::CUDA_R_16F && cu::CUDA_R_16BF == ::CUDA_R_16BF);
static_assert(cu::CUBLAS_OP_N == ::CUBLAS_OP_N && cu::CUBLAS_OP_T == ::CUBLAS_OP_T);
static_assert(cu::CUBLASLT_MATMUL_DESC_TRANSA == ::CUBLASLT_MATMUL_DESC_TRANSA);
static_assert(cu::CUBLASLT_MATMUL_DESC_TRANSB == ::CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(cu::CUBLASLT_MATMUL_DESC_EPILOGUE == ::CUBLASLT_MATMUL_DESC_EPILOGUE);
static_assert(cu::CUBLASLT_MATMUL_DESC_BIAS_POINTER == ::CUBLASLT_MATMUL_DESC_BIAS_POINTER);
static_assert(cu::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER ==
              ::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
static_assert(cu::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD == ::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD);
static_assert(cu::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE == ::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
static_assert(cu::CUBLASLT_EPILOGUE_DEFAULT == ::CUBLASLT_EPILOGUE_DEFAULT);
static_assert(cu::CUBLASLT_EPILOGUE_BIAS == ::CUBLASLT_EPILOGUE_BIAS);
static_assert(cu::CUBLASLT_EPILOGUE_GELU_BIAS == ::CUBLASLT_EPILOGUE_GELU_BIAS);
static_assert(cu::CUBLASLT_EPILOGUE_GELU_AUX_BIAS == ::CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
static_assert(cu::CUBLASLT_EPILOGUE_DGELU == ::CUBLASLT_EPILOGUE_DGELU);
static_assert(cu::CUBLASLT_EPILOGUE_DGELU_BGRAD == ::CUBLASLT_EPILOGUE_DGELU_BGRAD);
static_assert(cu::CUBLASLT_EPILOGUE_BGRADB == ::CUBLASLT_EPILOGUE_BGRADB);
static_assert(cu::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ==
              ::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(cu::ncclFloat16 == ::ncclFloat16 && cu::ncclFloat32 == ::ncclFloat32 &&
              cu::ncclFloat64 == ::ncclFloat64 && cu::ncclBfloat16 == ::ncclBfloat16);
static_assert(cu::ncclSum == ::ncclSum && cu::ncclMax == ::ncclMax && cu::ncclAvg == ::ncclAvg);
static_assert(cu::ncclScalarHostImmediate == ::ncclScalarHostImmediate);
static_assert(cu::ncclSuccess == ::ncclSuccess && cu::ncclInProgress == ::ncclInProgress);
} // namespace

TEST(CudaApiHeaders, DeclarationsMatchTheToolkit) {
  SUCCEED() << "checked at compile time against " MT_CUDA_INCLUDE_DIR;
}

#else

TEST(CudaApiHeaders, DeclarationsMatchTheToolkit) {
  GTEST_SKIP() << "no CUDA headers (cuda.h, nvrtc.h, cublasLt.h, nccl.h) were found at "
                  "configure time; runtime/exec/cuda/cuda_api.h's declarations are checked where they are";
}

#endif
