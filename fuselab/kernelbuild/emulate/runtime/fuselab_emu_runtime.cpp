// fuselab CPU emulation runtime: everything a launch, a CUDA runtime call and fuselab's Python side run that is
// not a kernel's own code. Compiled once per compiler, flags and runtime source (fuselab/kernelbuild/emulate/
// runtime_object.py) into an object linked into every emulated library, with hidden visibility: each library keeps its own
// copy of every symbol and its own state (settings, errors, workers), as when this code was a header.
#include "fuselab_emu.h"

#include <chrono>
#include <string>

#include "fuselab_emu_sched.h"
#include "fuselab_emu_state.h"

// What fuselab's Python side looks up in a library (ctypes): the only symbols the runtime exports.
#define FUSELAB_EMU_EXPORT __attribute__((visibility("default")))

// The built-in variables (fuselab_emu_launch.h): one copy per OS thread of each library.
__thread uint3 threadIdx;
__thread uint3 blockIdx;
__thread dim3 blockDim;
__thread dim3 gridDim;

namespace fuselab_emu {

void record_error(cudaError_t code, const std::string& detail, bool during_execution) {
  ErrorState& s = error_state();
  s.last = code;
  if (during_execution) s.pending = code;
  s.detail_code = code;
  s.detail = detail;
}

void record_error(cudaError_t code, const char* detail, bool during_execution) {
  record_error(code, std::string(detail ? detail : ""), during_execution);
}

long long clock_ns() {
  return (long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

cudaError_t copy_symbol(void* dst, const void* src, std::size_t bytes, std::size_t offset, std::size_t symbol_bytes,
                        const char* what) {
  if (offset + bytes > symbol_bytes) {
    record_error(cudaErrorInvalidValue, std::string(what) + " copies past the end of the symbol");
    return cudaErrorInvalidValue;
  }
  DeviceAccess access;
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}

// ---- the thread running now: barriers and warp operations (fuselab_emu_sync.h) ----
unsigned block_barrier(int predicate, const char* what, int line) {
  return current_worker(what).block_barrier(predicate, what, line);
}

long long barrier_count(unsigned phase) { return current_worker("__syncthreads_count()").barrier_count(phase); }

long long barrier_participants(unsigned phase) {
  return current_worker("__syncthreads_and()").barrier_participants(phase);
}

const std::uint64_t* warp_exchange(unsigned mask, std::uint64_t bits, unsigned* participants, int* lane,
                                   const char* what) {
  Worker& w = current_worker(what);
  *lane = w.current & 31;
  return w.warp_exchange(mask, bits, participants, what);
}

unsigned active_mask(const char* what) { return current_worker(what).active_mask(); }

[[noreturn]] void trap() {
  if (!tls_worker) std::abort();
  throw AbortLaunch{cudaErrorLaunchFailure, "__trap() was called"};
}

}  // namespace fuselab_emu

// ---- errors ----
const char* cudaGetErrorName(cudaError_t e) {
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

static const char* fuselab_emu_cuda_error_text(cudaError_t e) {
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

const char* cudaGetErrorString(cudaError_t e) {
  fuselab_emu::ErrorState& s = fuselab_emu::error_state();
  if (e == cudaSuccess || e != s.detail_code || s.detail.empty()) return fuselab_emu_cuda_error_text(e);
  s.text = std::string(fuselab_emu_cuda_error_text(e)) + " (CPU emulation: " + s.detail + ")";
  return s.text.c_str();
}

cudaError_t cudaGetLastError() {
  fuselab_emu::ErrorState& s = fuselab_emu::error_state();
  cudaError_t e = s.last;
  s.last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return fuselab_emu::error_state().last; }

// ---- the CUDA runtime's device, stream and memory calls ----
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
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

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
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

cudaError_t cudaGetDevice(int* device) { if (device) *device = 0; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) {
  if (device != 0) {
    fuselab_emu::record_error(cudaErrorInvalidDevice, "the emulation has one device, number 0");
    return cudaErrorInvalidDevice;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) { if (count) *count = 1; return cudaSuccess; }

// Launches run synchronously; a synchronize reports (and clears) an error raised while a kernel ran.
cudaError_t cudaDeviceSynchronize() {
  fuselab_emu::ErrorState& s = fuselab_emu::error_state();
  cudaError_t e = s.pending;
  s.pending = cudaSuccess;
  return e;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
// A created stream gets a handle of its own (never dereferenced), so that work on it is told apart from the
// launcher's stream and from stream 0.
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  static std::atomic<std::uintptr_t> next{0x5000};
  if (s) *s = reinterpret_cast<cudaStream_t>(next.fetch_add(0x10));
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }

// ---- memory ----
cudaError_t cudaMalloc(void** p, std::size_t bytes) {
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
cudaError_t cudaFree(void* p) {
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

cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  fuselab_emu::DeviceAccess access;
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  fuselab_emu::on_given_stream(stream, "cudaMemsetAsync");
  return cudaMemset(p, value, bytes);
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  fuselab_emu::DeviceAccess access;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream) {
  fuselab_emu::on_given_stream(stream, "cudaMemcpyAsync");
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                                std::size_t width, std::size_t height, cudaMemcpyKind) {
  fuselab_emu::DeviceAccess access;
  for (std::size_t r = 0; r < height; ++r)
    std::memmove((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
  return cudaSuccess;
}

// ---- controls for fuselab's Python side, called through ctypes ----

// 0 forward, 1 reverse, 2 random (a shuffle seeded by seed, the launch and the block).
extern "C" FUSELAB_EMU_EXPORT void fuselab_emu_set_thread_order(int order, unsigned long long seed) {
  fuselab_emu::Settings& s = fuselab_emu::settings();
  s.order = (order == 1 || order == 2) ? order : 0;
  s.seed = seed;
  s.launches_since_order = 0;
}

extern "C" FUSELAB_EMU_EXPORT int fuselab_emu_get_thread_order() { return fuselab_emu::thread_order(); }

extern "C" FUSELAB_EMU_EXPORT unsigned long long fuselab_emu_get_thread_seed() {
  fuselab_emu::thread_order();  // the seed of FUSELAB_EMU_SEED is read with the order
  return fuselab_emu::settings().seed.load();
}

// The first barrier not reached by every thread of its block since the last call (into msg): 1, or 0 if none.
extern "C" FUSELAB_EMU_EXPORT int fuselab_emu_take_barrier_note(char* msg, int cap) {
  fuselab_emu::Settings& s = fuselab_emu::settings();
  std::lock_guard<std::mutex> lock(s.note_mutex);
  if (s.barrier_note.empty()) return 0;
  if (msg && cap > 0) std::snprintf(msg, cap, "%s", s.barrier_note.c_str());
  s.barrier_note.clear();
  return 1;
}

// Watch the stream of one launcher call: `stream` is what fuselab passed it.
extern "C" FUSELAB_EMU_EXPORT void fuselab_emu_begin_call(void* stream) {
  fuselab_emu::CallStream& call = fuselab_emu::call_stream();
  call.active = true;
  call.given = static_cast<cudaStream_t>(stream);
  call.violation.clear();
}

// End the watch: 1 (and what ran elsewhere, in msg) when work went to another stream, else 0.
extern "C" FUSELAB_EMU_EXPORT int fuselab_emu_end_call(char* msg, int cap) {
  fuselab_emu::CallStream& call = fuselab_emu::call_stream();
  call.active = false;
  if (call.violation.empty()) return 0;
  if (msg && cap > 0) std::snprintf(msg, cap, "%s", call.violation.c_str());
  return 1;
}

// Guard device memory from the launcher's host code for one call (see DeviceGuard): `bases`/`sizes` are the
// page-aligned buffers fuselab's Python side staged the call's tensors in; `starting`/`ended` are called as each
// kernel or runtime copy starts and ends.
extern "C" FUSELAB_EMU_EXPORT void fuselab_emu_guard(void** bases, unsigned long long* sizes, int n, void (*starting)(),
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

extern "C" FUSELAB_EMU_EXPORT void fuselab_emu_unguard() {
  fuselab_emu::DeviceGuard& g = fuselab_emu::device_guard();
  g.starting = g.ended = nullptr;
  if (!g.active) return;
  fuselab_emu::device_memory_for_host(false);
  g.active = false;
  g.open = 0;
  g.ranges.clear();
}

// cudaMalloc's buffers (at most `cap` of them into bases/sizes); returns how many there are.
extern "C" FUSELAB_EMU_EXPORT int fuselab_emu_allocations(void** bases, unsigned long long* sizes, int cap) {
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

extern "C" FUSELAB_EMU_EXPORT unsigned long long fuselab_emu_device_variable_bytes(void** start) {
  *start = __start_fuselab_emu_device_variables;
  if (!__start_fuselab_emu_device_variables || !__stop_fuselab_emu_device_variables) return 0;
  return (unsigned long long)(__stop_fuselab_emu_device_variables - __start_fuselab_emu_device_variables);
}

// How many OS threads run blocks (0: OpenMP's default, usually one per core).
extern "C" FUSELAB_EMU_EXPORT void fuselab_emu_set_num_threads(int n) { fuselab_emu::settings().os_threads = n < 0 ? 0 : n; }

extern "C" FUSELAB_EMU_EXPORT int fuselab_emu_get_num_threads() { return fuselab_emu::settings().os_threads.load(); }

// Counters: 0 launches, 1 blocks run as plain loops, 2 blocks run on fibers, 3 context switches,
// 4 fibers created.
extern "C" FUSELAB_EMU_EXPORT unsigned long long fuselab_emu_stat(int which) {
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
