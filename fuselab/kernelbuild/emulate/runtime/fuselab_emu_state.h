// fuselab CPU emulation runtime: the state a library keeps between calls (errors, the device-memory guard, the
// stream a launcher was given). Part of the runtime only (fuselab_emu_runtime.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <sys/mman.h>
#include <utility>
#include <vector>

#include "fuselab_emu.h"

namespace fuselab_emu {

struct ErrorState {
  cudaError_t last = cudaSuccess;     // what cudaGetLastError returns (and clears)
  cudaError_t pending = cudaSuccess;  // a kernel's execution error, reported by the next synchronize
  cudaError_t detail_code = cudaSuccess;
  std::string detail;
  std::string text;  // storage for cudaGetErrorString's answer
};

inline ErrorState& error_state() {
  static thread_local ErrorState state;
  return state;
}

// The runtime's own callers pass what went wrong as a string.
void record_error(cudaError_t code, const std::string& detail, bool during_execution = false);

}  // namespace fuselab_emu

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

