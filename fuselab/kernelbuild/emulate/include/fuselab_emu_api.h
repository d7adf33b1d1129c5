// fuselab CPU emulation: the host-side CUDA runtime calls a launcher may make.
//
// "Device" memory is host memory: the tensors fuselab passes are CPU tensors. Streams do not exist
// (every launch is synchronous), so stream and synchronize calls only report errors. What the emulation does
// watch is which stream work is put on: while fuselab calls a launcher, a launch or an async copy on any
// stream but the launcher's `stream` argument is recorded, and fuselab raises (runtime/fuselab_emu_state.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fuselab_emu_errors.h"

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

#define cudaStreamNonBlocking 0x01
#define cudaStreamDefault 0x00
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

namespace fuselab_emu {
// The emulated device's limits are an H100/H200's (compute capability 9.0).
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
constexpr unsigned long long kMaxGridX = 2147483647ull;
constexpr unsigned kMaxGridY = 65535, kMaxGridZ = 65535;
constexpr std::size_t kSharedPerBlock = 48 * 1024;        // static, and dynamic without opt-in
constexpr std::size_t kSharedPerBlockOptin = 227 * 1024;  // 232448 bytes
constexpr int kMultiProcessors = 132;
}  // namespace fuselab_emu

struct cudaDeviceProp {
  char name[256];
  std::size_t totalGlobalMem;
  std::size_t sharedMemPerBlock;
  std::size_t sharedMemPerBlockOptin;
  std::size_t sharedMemPerMultiprocessor;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  int major;
  int minor;
  int l2CacheSize;
  int clockRate;
  int memoryClockRate;
  int memoryBusWidth;
};

// Defined in the runtime (runtime/fuselab_emu_runtime.cpp): host code, called rarely, compiled once.
#define FUSELAB_EMU_API FUSELAB_EMU_RUNTIME_API
FUSELAB_EMU_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
FUSELAB_EMU_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
FUSELAB_EMU_API cudaError_t cudaGetDevice(int* device);
FUSELAB_EMU_API cudaError_t cudaSetDevice(int device);
FUSELAB_EMU_API cudaError_t cudaGetDeviceCount(int* count);
// Launches run synchronously; a synchronize reports (and clears) an error raised while a kernel ran.
FUSELAB_EMU_API cudaError_t cudaDeviceSynchronize();
FUSELAB_EMU_API cudaError_t cudaStreamSynchronize(cudaStream_t stream);
FUSELAB_EMU_API cudaError_t cudaStreamCreate(cudaStream_t* s);
FUSELAB_EMU_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
FUSELAB_EMU_API cudaError_t cudaStreamDestroy(cudaStream_t stream);

// ---- memory ----
FUSELAB_EMU_API cudaError_t cudaMalloc(void** p, std::size_t bytes);
template <class T>
inline cudaError_t cudaMalloc(T** p, std::size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
template <class T>
inline cudaError_t cudaMallocAsync(T** p, std::size_t bytes, cudaStream_t) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
FUSELAB_EMU_API cudaError_t cudaFree(void* p);
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
FUSELAB_EMU_API cudaError_t cudaMemset(void* p, int value, std::size_t bytes);
FUSELAB_EMU_API cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream = 0);
FUSELAB_EMU_API cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
FUSELAB_EMU_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                            cudaStream_t stream = 0);
FUSELAB_EMU_API cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                                         std::size_t width, std::size_t height, cudaMemcpyKind kind);
inline cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                                     std::size_t width, std::size_t height, cudaMemcpyKind kind,
                                     cudaStream_t = 0) {
  return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
}

namespace fuselab_emu {
// A copy to or from a __device__/__constant__ variable of `symbol_bytes` bytes, `offset` bytes in: device work.
FUSELAB_EMU_API cudaError_t copy_symbol(void* dst, const void* src, std::size_t bytes, std::size_t offset,
                                        std::size_t symbol_bytes, const char* what);
}  // namespace fuselab_emu

template <class T>
inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, std::size_t bytes, std::size_t offset = 0,
                                      cudaMemcpyKind = cudaMemcpyHostToDevice) {
  return fuselab_emu::copy_symbol(reinterpret_cast<char*>(&symbol) + offset, src, bytes, offset, sizeof(T),
                                  "cudaMemcpyToSymbol");
}
template <class T>
inline cudaError_t cudaMemcpyToSymbolAsync(T& symbol, const void* src, std::size_t bytes, std::size_t offset = 0,
                                           cudaMemcpyKind kind = cudaMemcpyHostToDevice, cudaStream_t = 0) {
  return cudaMemcpyToSymbol(symbol, src, bytes, offset, kind);
}
template <class T>
inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, std::size_t bytes, std::size_t offset = 0,
                                        cudaMemcpyKind = cudaMemcpyDeviceToHost) {
  return fuselab_emu::copy_symbol(dst, reinterpret_cast<const char*>(&symbol) + offset, bytes, offset, sizeof(T),
                                  "cudaMemcpyFromSymbol");
}

// ---- occupancy ----
// A launcher may size its grid from CUDA's occupancy calculator. The emulation counts no registers: it answers as
// the device of its limits answers for a light kernel, bounded by threads (2048 a multiprocessor), resident blocks
// (32) and, where asked for, dynamic shared memory (228 KiB a multiprocessor, 1 KiB of it reserved per block).
namespace fuselab_emu {
inline int resident_blocks(int block_size, std::size_t dynamic_shared) {
  int blocks = 2048 / block_size < 32 ? 2048 / block_size : 32;
  if (dynamic_shared > 0) {
    const std::size_t by_shared = (std::size_t)(228 * 1024) / (dynamic_shared + 1024);
    if (by_shared < (std::size_t)blocks) blocks = (int)by_shared;
  }
  return blocks;
}
}  // namespace fuselab_emu

template <class F>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, F, int block_size,
                                                                 std::size_t dynamic_shared) {
  if (!num_blocks || block_size <= 0 || block_size > (int)fuselab_emu::kMaxThreadsPerBlock) {
    fuselab_emu::record_error(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: a block size "
                                                     "from 1 to 1024 and a place for the answer");
    return cudaErrorInvalidValue;
  }
  *num_blocks = fuselab_emu::resident_blocks(block_size, dynamic_shared);
  return cudaSuccess;
}

template <class F>
inline cudaError_t cudaOccupancyMaxPotentialBlockSize(int* min_grid_size, int* block_size, F, std::size_t
                                                      dynamic_shared = 0, int block_size_limit = 0) {
  if (!min_grid_size || !block_size || block_size_limit < 0) {
    fuselab_emu::record_error(cudaErrorInvalidValue, "cudaOccupancyMaxPotentialBlockSize: places for both answers");
    return cudaErrorInvalidValue;
  }
  int best = 0, best_threads = 0;
  const int limit = block_size_limit > 0 && block_size_limit < (int)fuselab_emu::kMaxThreadsPerBlock
                        ? block_size_limit : (int)fuselab_emu::kMaxThreadsPerBlock;
  for (int size = 32; size <= limit; size += 32) {  // CUDA's search: the most resident threads, the larger block
    const int threads = fuselab_emu::resident_blocks(size, dynamic_shared) * size;
    if (threads >= best_threads) best = size, best_threads = threads;
  }
  if (best == 0) best = limit, best_threads = fuselab_emu::resident_blocks(limit, dynamic_shared) * limit;
  *block_size = best;
  *min_grid_size = fuselab_emu::kMultiProcessors * (best_threads / best);
  return cudaSuccess;
}
