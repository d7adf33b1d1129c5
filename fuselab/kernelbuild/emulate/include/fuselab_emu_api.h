// fuselab CPU emulation: the host-side CUDA runtime calls a launcher may make.
//
// "Device" memory is host memory: the tensors fuselab passes are CPU tensors. Streams do not exist
// (every launch is synchronous), so stream and synchronize calls only report errors. What the emulation does
// watch is which stream work is put on: while fuselab calls a launcher, a launch or an async copy on any
// stream but the launcher's `stream` argument is recorded, and fuselab raises (see call_stream below).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

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
// Device memory is not host memory. While fuselab's Python side calls a launcher with the guard on
// (fuselab_emu_guard), the buffers it passed and every cudaMalloc'd buffer are inaccessible to host code, and
// readable and writable only while a kernel or a runtime copy (cudaMemcpy, cudaMemset...) runs: a launcher that
// reads or writes device memory itself faults, as it does on a GPU, instead of computing on the host.
// Host code can undo page protections (mprotect, /proc/self/mem...), so the verdict does not rest on them:
// fuselab's Python side (fuselab/kernel_memory.py) is told as each kernel or copy starts, to check that kernel
// memory is what the last one left, and as it ends, to take what it holds now.
struct DeviceGuard {
  bool active = false;
  int open = 0;                                             // nested device-side accesses
  std::vector<std::pair<void*, std::size_t>> ranges;        // page-aligned, for mprotect
  std::vector<std::pair<void*, std::size_t>> allocated;     // cudaMalloc's, always device memory
  void (*starting)() = nullptr;                             // device work starts (memory open)
  void (*ended)() = nullptr;                                // device work ended (memory still open)
};

inline DeviceGuard& device_guard() {
  static DeviceGuard guard;
  return guard;
}

inline void device_memory_for_host(bool host_side) {
  for (auto& r : device_guard().ranges) mprotect(r.first, r.second, host_side ? PROT_NONE : (PROT_READ | PROT_WRITE));
}

// For a scope that touches device memory on the device's behalf: a kernel's blocks, a runtime copy.
struct DeviceAccess {
  bool counted = false;
  DeviceAccess() {
    DeviceGuard& g = device_guard();
    if (g.active) {
      counted = true;
      if (g.open++ == 0) {
        device_memory_for_host(false);
        if (g.starting) g.starting();
      }
    }
  }
  ~DeviceAccess() {
    DeviceGuard& g = device_guard();
    if (counted && g.active && --g.open == 0) {
      if (g.ended) g.ended();
      device_memory_for_host(true);
    }
  }
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// The stream a launcher was given, while fuselab's Python side calls it (fuselab_emu_begin_call). On a GPU,
// work on any other stream escapes a CUDA-graph capture of the caller's stream and is not ordered with the
// caller's other work, so the emulation, where every launch is synchronous and would hide it, reports it.
struct CallStream {
  bool active = false;
  cudaStream_t given = nullptr;
  std::string violation;  // the first piece of work on another stream, described for a student
};

inline CallStream& call_stream() {
  static thread_local CallStream state;
  return state;
}

inline std::string describe_stream(cudaStream_t stream) {
  if (stream == nullptr) return "stream 0 (the legacy default stream: no stream given, or 0)";
  if (stream == cudaStreamLegacy) return "cudaStreamLegacy (the legacy default stream)";
  if (stream == cudaStreamPerThread) return "cudaStreamPerThread";
  return "a stream the launcher made itself";
}

// False (and the first such use recorded) when `stream` is not the launcher's own while a call is watched.
inline bool on_given_stream(cudaStream_t stream, const std::string& what) {
  CallStream& call = call_stream();
  if (!call.active || stream == call.given) return true;
  if (call.violation.empty()) call.violation = what + " on " + describe_stream(stream);
  return false;
}
}  // namespace fuselab_emu

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

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop || device != 0) {
    fuselab_emu::record_error(cudaErrorInvalidDevice, "the emulation has one device, number 0");
    return cudaErrorInvalidDevice;
  }
  std::memset(prop, 0, sizeof(*prop));
  std::strcpy(prop->name, "fuselab CPU emulation (limits of an H200)");
  prop->totalGlobalMem = (std::size_t)141 << 30;
  prop->sharedMemPerBlock = fuselab_emu::kSharedPerBlock;
  prop->sharedMemPerBlockOptin = fuselab_emu::kSharedPerBlockOptin;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = fuselab_emu::kMultiProcessors;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->major = 9;
  prop->minor = 0;
  prop->l2CacheSize = 60 * 1024 * 1024;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value || device != 0) {
    fuselab_emu::record_error(cudaErrorInvalidDevice, "the emulation has one device, number 0");
    return cudaErrorInvalidDevice;
  }
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)fuselab_emu::kSharedPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = fuselab_emu::kMultiProcessors; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 228 * 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)fuselab_emu::kSharedPerBlockOptin; break;
    default:
      fuselab_emu::record_error(cudaErrorInvalidValue, "this device attribute is not emulated");
      return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

inline cudaError_t cudaGetDevice(int* device) { if (device) *device = 0; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int device) {
  if (device != 0) {
    fuselab_emu::record_error(cudaErrorInvalidDevice, "the emulation has one device, number 0");
    return cudaErrorInvalidDevice;
  }
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* count) { if (count) *count = 1; return cudaSuccess; }

// Launches run synchronously; a synchronize reports (and clears) an error raised while a kernel ran.
inline cudaError_t cudaDeviceSynchronize() {
  fuselab_emu::ErrorState& s = fuselab_emu::error_state();
  cudaError_t e = s.pending;
  s.pending = cudaSuccess;
  return e;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
// A created stream gets a handle of its own (never dereferenced), so that work on it is told apart from the
// launcher's stream and from stream 0.
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  static std::atomic<std::uintptr_t> next{0x5000};
  if (s) *s = reinterpret_cast<cudaStream_t>(next.fetch_add(0x10));
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }

// ---- memory ----
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (!p) return cudaErrorInvalidValue;
  *p = nullptr;
  if (!bytes) return cudaSuccess;
  const std::size_t page = (std::size_t)sysconf(_SC_PAGESIZE);
  const std::size_t rounded = (bytes + page - 1) / page * page;  // its own pages: the guard protects them
  void* m = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    fuselab_emu::record_error(cudaErrorMemoryAllocation, "host allocation failed");
    return cudaErrorMemoryAllocation;
  }
  fuselab_emu::DeviceGuard& g = fuselab_emu::device_guard();
  g.allocated.emplace_back(m, rounded);
  if (g.active) {
    g.ranges.emplace_back(m, rounded);
    if (g.open == 0) mprotect(m, rounded, PROT_NONE);
  }
  *p = m;
  return cudaSuccess;
}
template <class T>
inline cudaError_t cudaMalloc(T** p, std::size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); }
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
template <class T>
inline cudaError_t cudaMallocAsync(T** p, std::size_t bytes, cudaStream_t) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  // device work: the watch checks the buffer as it goes, and forgets it (its address may come back, zeroed)
  fuselab_emu::DeviceAccess access;
  fuselab_emu::DeviceGuard& g = fuselab_emu::device_guard();
  std::size_t length = 0;
  for (auto* list : {&g.allocated, &g.ranges})
    for (auto it = list->begin(); it != list->end(); ++it)
      if (it->first == p) {
        length = it->second;
        list->erase(it);
        break;
      }
  if (!length) return cudaErrorInvalidValue;  // not a pointer cudaMalloc gave
  munmap(p, length);
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }

inline cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  fuselab_emu::DeviceAccess access;
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream = 0) {
  fuselab_emu::on_given_stream(stream, "cudaMemsetAsync");
  return cudaMemset(p, value, bytes);
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  fuselab_emu::DeviceAccess access;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = 0) {
  fuselab_emu::on_given_stream(stream, "cudaMemcpyAsync");
  return cudaMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                                std::size_t width, std::size_t height, cudaMemcpyKind) {
  fuselab_emu::DeviceAccess access;
  for (std::size_t r = 0; r < height; ++r)
    std::memmove((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                                     std::size_t width, std::size_t height, cudaMemcpyKind kind,
                                     cudaStream_t = 0) {
  return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
}
template <class T>
inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, std::size_t bytes, std::size_t offset = 0,
                                      cudaMemcpyKind = cudaMemcpyHostToDevice) {
  if (offset + bytes > sizeof(T)) {
    fuselab_emu::record_error(cudaErrorInvalidValue, "cudaMemcpyToSymbol copies past the end of the symbol");
    return cudaErrorInvalidValue;
  }
  fuselab_emu::DeviceAccess access;
  std::memcpy(reinterpret_cast<char*>(&symbol) + offset, src, bytes);
  return cudaSuccess;
}
template <class T>
inline cudaError_t cudaMemcpyToSymbolAsync(T& symbol, const void* src, std::size_t bytes, std::size_t offset = 0,
                                           cudaMemcpyKind kind = cudaMemcpyHostToDevice, cudaStream_t = 0) {
  return cudaMemcpyToSymbol(symbol, src, bytes, offset, kind);
}
template <class T>
inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, std::size_t bytes, std::size_t offset = 0,
                                        cudaMemcpyKind = cudaMemcpyDeviceToHost) {
  if (offset + bytes > sizeof(T)) {
    fuselab_emu::record_error(cudaErrorInvalidValue, "cudaMemcpyFromSymbol copies past the end of the symbol");
    return cudaErrorInvalidValue;
  }
  fuselab_emu::DeviceAccess access;
  std::memcpy(dst, reinterpret_cast<const char*>(&symbol) + offset, bytes);
  return cudaSuccess;
}
