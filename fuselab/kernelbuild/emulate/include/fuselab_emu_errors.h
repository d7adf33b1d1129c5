// fuselab CPU emulation: cudaError_t and the per-host-thread "last error", as the CUDA runtime keeps it.
//
// cudaGetErrorString returns CUDA's own text, followed by the emulation's explanation of the most recent
// error of that code on this thread (which limit a launch broke, which block deadlocked), so that a
// student sees why, not only what.
#pragma once

#include "fuselab_emu_types.h"

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

// Defined in the runtime (runtime/fuselab_emu_runtime.cpp).
namespace fuselab_emu {
FUSELAB_EMU_RUNTIME_API void record_error(cudaError_t code, const char* detail, bool during_execution = false);
}  // namespace fuselab_emu

FUSELAB_EMU_RUNTIME_API const char* cudaGetErrorName(cudaError_t e);
FUSELAB_EMU_RUNTIME_API const char* cudaGetErrorString(cudaError_t e);
FUSELAB_EMU_RUNTIME_API cudaError_t cudaGetLastError();
FUSELAB_EMU_RUNTIME_API cudaError_t cudaPeekAtLastError();
