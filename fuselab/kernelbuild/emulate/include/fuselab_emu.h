// fuselab CPU emulation of CUDA: the header every emulated kernel file is compiled with.
//
// fuselab.kernelbuild.emulate.translate() rewrites the few constructs a header cannot (kernel launches,
// __shared__ declarations, #pragma unroll, assert); this header supplies the rest of CUDA's device and
// runtime vocabulary. One translation unit per library, so the extern "C" controls below are defined
// here.
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

#include "fuselab_emu_types.h"
#include "fuselab_emu_half.h"
#include "fuselab_emu_math.h"
#include "fuselab_emu_errors.h"
#include "fuselab_emu_api.h"
#include "fuselab_emu_sched.h"
#include "fuselab_emu_sync.h"

#ifndef CUDART_INF_F
#define CUDART_INF_F HUGE_VALF
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_INF HUGE_VAL
#define CUDART_PI_F 3.141592654f
#define CUDART_PI 3.1415926535897931e+0
#endif

// ---- controls for fuselab's Python side, called through ctypes ----

// 0 forward, 1 reverse, 2 random (a shuffle seeded by seed, the launch and the block).
extern "C" void fuselab_emu_set_thread_order(int order, unsigned long long seed) {
  fuselab_emu::Settings& s = fuselab_emu::settings();
  s.order = (order == 1 || order == 2) ? order : 0;
  s.seed = seed;
  s.launches_since_order = 0;
}

extern "C" int fuselab_emu_get_thread_order() { return fuselab_emu::thread_order(); }

extern "C" unsigned long long fuselab_emu_get_thread_seed() {
  fuselab_emu::thread_order();  // the seed of FUSELAB_EMU_SEED is read with the order
  return fuselab_emu::settings().seed.load();
}

// The first barrier not reached by every thread of its block since the last call (into msg): 1, or 0 if none.
extern "C" int fuselab_emu_take_barrier_note(char* msg, int cap) {
  fuselab_emu::Settings& s = fuselab_emu::settings();
  std::lock_guard<std::mutex> lock(s.note_mutex);
  if (s.barrier_note.empty()) return 0;
  if (msg && cap > 0) std::snprintf(msg, cap, "%s", s.barrier_note.c_str());
  s.barrier_note.clear();
  return 1;
}

// Watch the stream of one launcher call: `stream` is what fuselab passed it.
extern "C" void fuselab_emu_begin_call(void* stream) {
  fuselab_emu::CallStream& call = fuselab_emu::call_stream();
  call.active = true;
  call.given = static_cast<cudaStream_t>(stream);
  call.violation.clear();
}

// End the watch: 1 (and what ran elsewhere, in msg) when work went to another stream, else 0.
extern "C" int fuselab_emu_end_call(char* msg, int cap) {
  fuselab_emu::CallStream& call = fuselab_emu::call_stream();
  call.active = false;
  if (call.violation.empty()) return 0;
  if (msg && cap > 0) std::snprintf(msg, cap, "%s", call.violation.c_str());
  return 1;
}

// Guard device memory from the launcher's host code for one call (see DeviceGuard): `bases`/`sizes` are the
// page-aligned buffers fuselab's Python side staged the call's tensors in; `starting`/`ended` are called as each
// kernel or runtime copy starts and ends.
extern "C" void fuselab_emu_guard(void** bases, unsigned long long* sizes, int n, void (*starting)(),
                                  void (*ended)()) {
  fuselab_emu::DeviceGuard& g = fuselab_emu::device_guard();
  g.ranges = g.allocated;
  for (int i = 0; i < n; ++i) g.ranges.emplace_back(bases[i], (std::size_t)sizes[i]);
  g.open = 0;
  g.starting = starting;
  g.ended = ended;
  g.active = true;
  fuselab_emu::device_memory_for_host(true);
}

extern "C" void fuselab_emu_unguard() {
  fuselab_emu::DeviceGuard& g = fuselab_emu::device_guard();
  g.starting = g.ended = nullptr;
  if (!g.active) return;
  fuselab_emu::device_memory_for_host(false);
  g.active = false;
  g.open = 0;
  g.ranges.clear();
}

// cudaMalloc's buffers (at most `cap` of them into bases/sizes); returns how many there are.
extern "C" int fuselab_emu_allocations(void** bases, unsigned long long* sizes, int cap) {
  const auto& allocated = fuselab_emu::device_guard().allocated;
  for (int i = 0; i < cap && i < (int)allocated.size(); ++i) {
    bases[i] = allocated[i].first;
    sizes[i] = allocated[i].second;
  }
  return (int)allocated.size();
}

// __device__ and __constant__ variables: the translator places them in this section (FUSELAB_EMU_DEVICE_VARIABLE),
// whose bounds the linker gives; hidden, so a library without any never finds another library's.
extern "C" char __start_fuselab_emu_device_variables[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_fuselab_emu_device_variables[] __attribute__((weak, visibility("hidden")));

extern "C" unsigned long long fuselab_emu_device_variable_bytes(void** start) {
  *start = __start_fuselab_emu_device_variables;
  if (!__start_fuselab_emu_device_variables || !__stop_fuselab_emu_device_variables) return 0;
  return (unsigned long long)(__stop_fuselab_emu_device_variables - __start_fuselab_emu_device_variables);
}

// How many OS threads run blocks (0: OpenMP's default, usually one per core).
extern "C" void fuselab_emu_set_num_threads(int n) { fuselab_emu::settings().os_threads = n < 0 ? 0 : n; }

extern "C" int fuselab_emu_get_num_threads() { return fuselab_emu::settings().os_threads.load(); }

// Counters: 0 launches, 1 blocks run as plain loops, 2 blocks run on fibers, 3 context switches,
// 4 fibers created.
extern "C" unsigned long long fuselab_emu_stat(int which) {
  fuselab_emu::Settings& s = fuselab_emu::settings();
  switch (which) {
    case 0: return s.launches.load();
    case 1: return s.loop_blocks.load();
    case 2: return s.fiber_blocks.load();
    case 3: return s.switches.load();
    case 4: return s.fibers.load();
    default: return 0;
  }
}
