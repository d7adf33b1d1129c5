// fuselab CPU emulation: cudaError_t and the per-host-thread "last error", as the CUDA runtime keeps it.
//
// cudaGetErrorString returns CUDA's own text, followed by the emulation's explanation of the most recent
// error of that code on this thread (which limit a launch broke, which block deadlocked), so that a
// student sees why, not only what.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidSymbol = 13,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999
} cudaError_t;
typedef cudaError_t CUresult;

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

inline void record_error(cudaError_t code, const std::string& detail, bool during_execution = false) {
  ErrorState& s = error_state();
  s.last = code;
  if (during_execution) s.pending = code;
  s.detail_code = code;
  s.detail = detail;
}

}  // namespace fuselab_emu

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidSymbol: return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchTimeout: return "cudaErrorLaunchTimeout";
    case cudaErrorAssert: return "cudaErrorAssert";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

inline const char* fuselab_emu_cuda_error_text(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
  }
}

inline const char* cudaGetErrorString(cudaError_t e) {
  fuselab_emu::ErrorState& s = fuselab_emu::error_state();
  if (e == cudaSuccess || e != s.detail_code || s.detail.empty()) return fuselab_emu_cuda_error_text(e);
  s.text = std::string(fuselab_emu_cuda_error_text(e)) + " (CPU emulation: " + s.detail + ")";
  return s.text.c_str();
}

inline cudaError_t cudaGetLastError() {
  fuselab_emu::ErrorState& s = fuselab_emu::error_state();
  cudaError_t e = s.last;
  s.last = cudaSuccess;
  return e;
}

inline cudaError_t cudaPeekAtLastError() { return fuselab_emu::error_state().last; }
