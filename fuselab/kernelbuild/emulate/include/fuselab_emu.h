// fuselab CPU emulation of CUDA: the header every emulated kernel file is compiled with.
//
// fuselab.kernelbuild.emulate.translate() rewrites the few constructs a header cannot (kernel launches,
// __shared__ declarations, #pragma unroll, assert); this header supplies the rest of CUDA's device and
// runtime vocabulary. What runs a launch, the CUDA runtime calls and the controls fuselab's Python side calls
// are the runtime's (../runtime/fuselab_emu_runtime.cpp), compiled once per compiler and flags and linked into
// every library (fuselab/kernelbuild/emulate/runtime_object.py): a kernel file compiles only its own code.
#pragma once

#define FUSELAB_EMULATION 1
#ifndef __CUDACC__
#define __CUDACC__ 1
#endif
#ifndef CUDART_VERSION
#define CUDART_VERSION 13000
#endif

// CUDA's function and variable qualifiers. Everything is host code here.
#define __global__
#define __device__
#define __host__
#define __constant__
// What the translator adds to a __device__ or __constant__ variable: kernel memory, which fuselab watches.
#define FUSELAB_EMU_DEVICE_VARIABLE __attribute__((section("fuselab_emu_device_variables")))
#define __managed__
#define __forceinline__ inline
// __noinline__ is rewritten by the translator: libstdc++ spells __attribute__((__noinline__)) itself.
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __cudart_builtin__
// The translator rewrites every __shared__ it sees; one that survives came from a macro it cannot follow.
#define __shared__ FUSELAB_EMULATION_ERROR_shared_declared_through_a_macro_is_not_supported

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cfloat>
#include <climits>
#include <limits>
#include <new>
// Not what nvcc's host side gives, but what a launcher's host code has always seen here, and cheap to parse: the
// guard of device memory is tested against host code that calls mprotect (samples host_loop_mprotect).
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuselab_emu_types.h"
#include "fuselab_emu_half.h"
#include "fuselab_emu_math.h"
#include "fuselab_emu_errors.h"
#include "fuselab_emu_api.h"
#include "fuselab_emu_launch.h"
#include "fuselab_emu_sync.h"

#ifndef CUDART_INF_F
#define CUDART_INF_F HUGE_VALF
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_INF HUGE_VAL
#define CUDART_PI_F 3.141592654f
#define CUDART_PI 3.1415926535897931e+0
#endif
