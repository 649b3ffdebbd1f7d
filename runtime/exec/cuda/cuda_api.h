// The CUDA libraries mt uses (driver API, NVRTC, cuBLASLt, NCCL), loaded with
// dlopen at run time: mtrun builds without the CUDA toolkit and runs its CPU
// path on machines without a GPU driver.
//
// No CUDA header is included. The few types and enum values used are
// declared here with the values documented in cuda.h, nvrtc.h, cublasLt.h
// and nccl.h; test/unit/runtime/exec/cuda/CudaApiHeaderTest.cpp checks every function pointer
// type and constant below against those headers wherever the toolkit is
// installed at configure time. Driver entry points are resolved by their ABI
// names (the `_v2` suffixes cuda.h's macros add), which is what a
// header-based build would link against.
#ifndef MT_RUNTIME_CUDA_API_H
#define MT_RUNTIME_CUDA_API_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/exec/cuda/launch_limits.h"

namespace mt::cu {

// ---- driver API (cuda.h) ----
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUdevice_attribute = int;
using CUstreamCaptureMode = int;
using CUfunction_attribute = int;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr CUstreamCaptureMode CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
// (kDefaultMaxDynamicSharedBytes and the other launch limits: launch_limits.h.)

struct Driver {
  std::string path; // the file dlopen found
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int *version);
  CUresult (*cuGetErrorName)(CUresult error, const char **name);
  CUresult (*cuGetErrorString)(CUresult error, const char **text);
  CUresult (*cuDeviceGetCount)(int *count);
  CUresult (*cuDeviceGet)(CUdevice *device, int ordinal);
  CUresult (*cuDeviceGetName)(char *name, int len, CUdevice device);
  CUresult (*cuDeviceGetAttribute)(int *value, CUdevice_attribute attrib, CUdevice device);
  CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice device);            // _v2
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);                  // _v2
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemGetInfo)(size_t *free, size_t *total);                   // _v2
  CUresult (*cuMemAlloc)(CUdeviceptr *dptr, size_t bytes);                 // _v2
  CUresult (*cuMemFree)(CUdeviceptr dptr);                                 // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes); // _v2
  CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);       // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes,
                                CUstream stream);                           // _v2
  CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes,
                                CUstream stream);                           // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                CUstream stream);                           // _v2
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream);
  CUresult (*cuModuleLoadData)(CUmodule *module, const void *image);
  CUresult (*cuModuleUnload)(CUmodule module);
  CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule module, const char *name);
  CUresult (*cuFuncGetAttribute)(int *value, CUfunction_attribute attrib, CUfunction fn);
  CUresult (*cuFuncSetAttribute)(CUfunction fn, CUfunction_attribute attrib, int value);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ,
                             unsigned blockX, unsigned blockY, unsigned blockZ,
                             unsigned sharedBytes, CUstream stream, void **params, void **extra);
  CUresult (*cuStreamCreate)(CUstream *stream, unsigned flags);
  CUresult (*cuStreamDestroy)(CUstream stream);                            // _v2
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuStreamQuery)(CUstream stream);
  CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned flags);
  CUresult (*cuEventCreate)(CUevent *event, unsigned flags);
  CUresult (*cuEventDestroy)(CUevent event);                               // _v2
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventQuery)(CUevent event);
  CUresult (*cuStreamBeginCapture)(CUstream stream, CUstreamCaptureMode mode); // _v2
  CUresult (*cuStreamEndCapture)(CUstream stream, CUgraph *graph);
  CUresult (*cuGraphInstantiate)(CUgraphExec *exec, CUgraph graph,
                                 unsigned long long flags);                 // WithFlags
  CUresult (*cuGraphLaunch)(CUgraphExec exec, CUstream stream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec exec);
  CUresult (*cuGraphDestroy)(CUgraph graph);
};

// "CUDA_ERROR_NO_DEVICE (100)": the driver's name for r when it knows it
// (the toolkit's stub library does not), else mt's table, else the number.
std::string result_name(const Driver *driver, CUresult r);

// ---- NVRTC (nvrtc.h) ----
using nvrtcResult = int;
typedef struct _nvrtcProgram *nvrtcProgram;
constexpr nvrtcResult NVRTC_SUCCESS = 0;
constexpr nvrtcResult NVRTC_ERROR_COMPILATION = 6;

struct Nvrtc {
  std::string path;
  int major = 0, minor = 0; // nvrtcVersion
  const char *(*nvrtcGetErrorString)(nvrtcResult result);
  nvrtcResult (*nvrtcVersion)(int *major, int *minor);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int *count);
  nvrtcResult (*nvrtcGetSupportedArchs)(int *archs);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *prog, const char *src, const char *name,
                                    int numHeaders, const char *const *headers,
                                    const char *const *includeNames);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *prog);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram prog, int numOptions,
                                     const char *const *options);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram prog, char *cubin);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram prog, char *ptx);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram prog, char *log);
};

// ---- cuBLASLt (cublasLt.h) ----
using cublasStatus_t = int;
using cublasComputeType_t = int;
using cudaDataType_t = int;
using cublasLtMatmulDescAttributes_t = int;
using cublasLtMatmulPreferenceAttributes_t = int;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_t *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_t *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque_t *cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

// cublasLt.h, cublas_api.h and library_types.h values mt uses.
constexpr cublasComputeType_t CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_64F = 70;
constexpr cudaDataType_t CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14;
constexpr int CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
constexpr cublasLtMatmulDescAttributes_t CUBLASLT_MATMUL_DESC_TRANSA = 3,
                                         CUBLASLT_MATMUL_DESC_TRANSB = 4,
                                         CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
                                         CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
                                         CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
                                         CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
                                         CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26;
constexpr uint32_t CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4,
                   CUBLASLT_EPILOGUE_GELU_BIAS = 32 | 4,
                   CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
                   CUBLASLT_EPILOGUE_DGELU = 64 | 128,
                   CUBLASLT_EPILOGUE_DGELU_BGRAD = 64 | 128 | 16,
                   CUBLASLT_EPILOGUE_BGRADB = 512;
constexpr cublasLtMatmulPreferenceAttributes_t CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;

struct CublasLt {
  std::string path;
  size_t version = 0; // cublasLtGetVersion: major * 10000 + minor * 100 + patch
  size_t (*cublasLtGetVersion)();
  cublasStatus_t (*cublasLtCreate)(cublasLtHandle_t *handle);
  cublasStatus_t (*cublasLtDestroy)(cublasLtHandle_t handle);
  cublasStatus_t (*cublasLtMatmulDescCreate)(cublasLtMatmulDesc_t *desc,
                                             cublasComputeType_t compute,
                                             cudaDataType_t scaleType);
  cublasStatus_t (*cublasLtMatmulDescDestroy)(cublasLtMatmulDesc_t desc);
  cublasStatus_t (*cublasLtMatmulDescSetAttribute)(cublasLtMatmulDesc_t desc,
                                                   cublasLtMatmulDescAttributes_t attr,
                                                   const void *buf, size_t size);
  cublasStatus_t (*cublasLtMatrixLayoutCreate)(cublasLtMatrixLayout_t *layout, cudaDataType_t type,
                                               uint64_t rows, uint64_t cols, int64_t ld);
  cublasStatus_t (*cublasLtMatrixLayoutDestroy)(cublasLtMatrixLayout_t layout);
  cublasStatus_t (*cublasLtMatmulPreferenceCreate)(cublasLtMatmulPreference_t *pref);
  cublasStatus_t (*cublasLtMatmulPreferenceDestroy)(cublasLtMatmulPreference_t pref);
  cublasStatus_t (*cublasLtMatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t pref,
                                                         cublasLtMatmulPreferenceAttributes_t attr,
                                                         const void *buf, size_t size);
  cublasStatus_t (*cublasLtMatmulAlgoGetHeuristic)(
      cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
      cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t *results,
      int *returned);
  cublasStatus_t (*cublasLtMatmul)(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                   const void *alpha, const void *a, cublasLtMatrixLayout_t aDesc,
                                   const void *b, cublasLtMatrixLayout_t bDesc, const void *beta,
                                   const void *c, cublasLtMatrixLayout_t cDesc, void *d,
                                   cublasLtMatrixLayout_t dDesc, const cublasLtMatmulAlgo_t *algo,
                                   void *workspace, size_t workspaceBytes, CUstream stream);
};

// ---- NCCL (nccl.h) ----
using ncclResult_t = int;
using ncclDataType_t = int;
using ncclRedOp_t = int;
typedef struct ncclComm *ncclComm_t;
struct ncclUniqueId {
  char internal[128];
};

// nccl.h's values (stable since NCCL 2.10).
constexpr ncclDataType_t ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9;
constexpr ncclRedOp_t ncclSum = 0, ncclMax = 2, ncclAvg = 4;
constexpr ncclResult_t ncclSuccess = 0, ncclInProgress = 7;
using ncclScalarResidence_t = int;
constexpr ncclScalarResidence_t ncclScalarHostImmediate = 1;

struct Nccl {
  std::string path;
  int version = 0; // ncclGetVersion: major * 10000 + minor * 100 + patch
  ncclResult_t (*ncclGetVersion)(int *version);
  const char *(*ncclGetErrorString)(ncclResult_t result);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId *id);
  ncclResult_t (*ncclCommInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm);
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm, ncclResult_t *asyncError);
  ncclResult_t (*ncclGroupStart)();
  ncclResult_t (*ncclGroupEnd)();
  // A sum whose inputs are first multiplied by *scalar (of `type`).
  ncclResult_t (*ncclRedOpCreatePreMulSum)(ncclRedOp_t *op, void *scalar, ncclDataType_t type,
                                           ncclScalarResidence_t residence, ncclComm_t comm);
  ncclResult_t (*ncclRedOpDestroy)(ncclRedOp_t op, ncclComm_t comm);
  ncclResult_t (*ncclAllReduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                                ncclRedOp_t op, ncclComm_t comm, CUstream stream);
  ncclResult_t (*ncclAllGather)(const void *send, void *recv, size_t sendCount,
                                ncclDataType_t type, ncclComm_t comm, CUstream stream);
  ncclResult_t (*ncclReduceScatter)(const void *send, void *recv, size_t recvCount,
                                    ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                    CUstream stream);
  ncclResult_t (*ncclReduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                             ncclRedOp_t op, int root, ncclComm_t comm, CUstream stream);
  ncclResult_t (*ncclBroadcast)(const void *send, void *recv, size_t count, ncclDataType_t type,
                                int root, ncclComm_t comm, CUstream stream);
  ncclResult_t (*ncclSend)(const void *send, size_t count, ncclDataType_t type, int peer,
                           ncclComm_t comm, CUstream stream);
  ncclResult_t (*ncclRecv)(void *recv, size_t count, ncclDataType_t type, int peer,
                           ncclComm_t comm, CUstream stream);
};

// Oldest versions mt accepts. NVRTC and cuBLASLt: CUDA 12 (the first with
// sm_90 and the FP8/bf16 epilogues the GEMM lowering uses). NCCL 2.18: the
// first with ncclCommSplit, which the tensor/data-parallel groups will use.
constexpr int kMinNvrtcMajor = 12;
constexpr size_t kMinCublasLtVersion = 120000;
constexpr int kMinNcclVersion = 21800;

// Where the toolkit libraries are looked for, in order: `dirs`, then the
// system loader (LD_LIBRARY_PATH, /etc/ld.so.cache) when `system` is set,
// then `fallback_dirs`.
struct LibrarySearch {
  std::vector<std::string> dirs;
  bool system = true;
  std::vector<std::string> fallback_dirs;
  // When set, this file only (a user's override of the whole search).
  std::string file;
};

// The default search: $MT_CUDA_HOME/lib64, $MT_CUDA_HOME/lib, $CUDA_HOME/lib64,
// $CUDA_HOME/lib (those set), the system loader, then /usr/local/cuda/lib64.
// The system loader comes before /usr/local/cuda so LD_LIBRARY_PATH (module
// systems, containers) wins over a default install.
LibrarySearch default_library_search();
// NVRTC's search: $MT_NVRTC_LIBRARY (that file only) when set, else the
// default search.
LibrarySearch nvrtc_library_search();

// Each loader returns a table with every entry point resolved and the
// library's version checked, or nullptr and *error set to one line naming
// the library, the file names and places tried (or the file and the missing
// symbol, or the version found and needed) and what to install.
// The handle stays open for the life of the process (CUDA libraries are
// not meant to be unloaded).

// libcuda.so.1 comes only from the system loader: the driver is installed
// with the kernel module, never from a toolkit directory (the toolkit's
// lib64/stubs/libcuda.so links but cannot run anything).
const Driver *load_driver(std::string *error);
// Loaded once per process with default_library_search() (NVRTC with
// nvrtc_library_search()).
const Nvrtc *load_nvrtc(std::string *error);
const CublasLt *load_cublaslt(std::string *error);
const Nccl *load_nccl(std::string *error);

// The same with an explicit search and no process-wide caching (tests).
// The caller owns the result; the library stays loaded.
Nvrtc *load_nvrtc_from(const LibrarySearch &search, std::string *error);
CublasLt *load_cublaslt_from(const LibrarySearch &search, std::string *error);
Nccl *load_nccl_from(const LibrarySearch &search, std::string *error);

} // namespace mt::cu

#endif // MT_RUNTIME_CUDA_API_H
