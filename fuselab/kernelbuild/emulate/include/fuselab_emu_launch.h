// fuselab CPU emulation: what a kernel file sees of launches and of the threads that run them.
//
// How a launch runs (blocks on the cores, a block's threads in a chosen order, fibers for threads that wait at
// a barrier) is the runtime's (runtime/fuselab_emu_sched.h), compiled once and linked into every library. A
// kernel file instantiates only a thin shim per launch: the arguments packed, one type-erased call into the
// runtime. The built-in variables, math, half and atomics stay inline (fuselab_emu_math.h): they are what a
// kernel runs most.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fuselab_emu_api.h"
#include "fuselab_emu_types.h"

// The built-in variables: one copy per OS thread, defined in the runtime, which sets threadIdx before it resumes a
// thread. Hidden and local-dynamic: read as cheaply as a variable of the kernel's own file.
#define FUSELAB_EMU_BUILTIN extern __thread __attribute__((visibility("hidden"), tls_model("local-dynamic")))
FUSELAB_EMU_BUILTIN uint3 threadIdx;
FUSELAB_EMU_BUILTIN uint3 blockIdx;
FUSELAB_EMU_BUILTIN dim3 blockDim;
FUSELAB_EMU_BUILTIN dim3 gridDim;
#undef FUSELAB_EMU_BUILTIN
static constexpr int warpSize = 32;

namespace fuselab_emu {

constexpr std::uint64_t kGarbageBits = 0x7FBADBAD7FBADBADull;  // a NaN as float (and as the halves of a double)

struct KernelBody {
  void (*invoke)(void*);
  void* context;
};

struct LaunchSite {
  const char* kernel;
  const char* file;
  int line;
  bool fibers;  // the kernel may wait at a barrier or a warp operation
};

// Runs the launch (or records why it cannot run, or that it went to another stream than the launcher's).
FUSELAB_EMU_RUNTIME_API void launch_kernel(const LaunchSite& site, dim3 grid, dim3 block, std::size_t dynamic_shared,
                                           cudaStream_t stream, KernelBody body);

template <class Fn, class Tuple>
struct BoundKernel {
  Fn* fn;
  Tuple* args;
  static void invoke(void* self) {
    BoundKernel* b = static_cast<BoundKernel*>(self);
    std::apply(*b->fn, *b->args);
  }
};

// What `kernel<<<grid, block, shmem, stream>>>(args...)` becomes. The arguments are copied once, as CUDA
// copies them at the launch; each emulated thread then calls the kernel with them.
template <class Fn, class... Args>
static inline void launch(const LaunchSite& site, dim3 grid, dim3 block, std::size_t dynamic_shared,
                          cudaStream_t stream, Fn&& fn, Args&&... args) {
  auto packed = std::make_tuple(args...);
  using Bound = BoundKernel<std::remove_reference_t<Fn>, decltype(packed)>;
  Bound bound{&fn, &packed};
  launch_kernel(site, grid, block, dynamic_shared, stream, KernelBody{&Bound::invoke, &bound});
}

// What the translator makes of a `__shared__` declaration: register it, fill it with garbage the first
// time each block reaches it.
FUSELAB_EMU_RUNTIME_API void shared_static(void* address, std::size_t bytes);
FUSELAB_EMU_RUNTIME_API void* dynamic_shared_memory();

FUSELAB_EMU_RUNTIME_API cudaError_t set_function_attribute(const char* kernel, cudaFuncAttribute attribute,
                                                           int value);
template <class F>
static inline cudaError_t func_set_attribute(const char* kernel, F&&, cudaFuncAttribute attribute, int value) {
  return set_function_attribute(kernel, attribute, value);
}

[[noreturn]] FUSELAB_EMU_RUNTIME_API void assert_fail(const char* expression, const char* file, int line);
[[noreturn]] FUSELAB_EMU_RUNTIME_API void trap();

// Barriers and warp operations of the thread running now (`what` names the call, for a student's message).
// block_barrier returns the barrier's phase, for __syncthreads_count; `line`: where the kernel calls it (0: not known).
FUSELAB_EMU_RUNTIME_API unsigned block_barrier(int predicate, const char* what, int line);
FUSELAB_EMU_RUNTIME_API long long barrier_count(unsigned phase);
FUSELAB_EMU_RUNTIME_API long long barrier_participants(unsigned phase);
// Deposit a value, wait for the lanes named in mask, read the row; `lane` is the caller's.
FUSELAB_EMU_RUNTIME_API const std::uint64_t* warp_exchange(unsigned mask, std::uint64_t bits, unsigned* participants,
                                                           int* lane, const char* what);
FUSELAB_EMU_RUNTIME_API unsigned active_mask(const char* what);

}  // namespace fuselab_emu

// Without the translator (a plain `cudaFuncSetAttribute` the rewrite did not see), the limit applies to
// every kernel of the library.
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F&& f, cudaFuncAttribute attribute, int value) {
  return fuselab_emu::func_set_attribute("*", f, attribute, value);
}
