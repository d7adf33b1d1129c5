// fuselab CPU emulation: how a launch runs.
//
// Blocks are spread over the CPU cores with OpenMP; each OS thread (a "Worker") runs one block at a time.
// Inside a block, emulated CUDA threads run one after another in a chosen order (forward, reverse or a
// seeded shuffle). A thread runs until it finishes or waits at a barrier (__syncthreads, a warp
// shuffle, __syncwarp); then the next thread runs. So the threads of a block are as serialized as a GPU
// may ever make them, and a kernel that forgets a barrier reads stale or garbage values instead of
// passing by luck.
//
// Kernels that contain no barrier run as a plain loop over threads, without fibers (the translator
// decides per kernel). Threads that may wait run on fibers, created lazily and reused, so a block
// that never reaches a barrier costs one fiber and two switches per thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <omp.h>
#include <csetjmp>
#include <csignal>

#include "fuselab_emu.h"
#include "fuselab_emu_fiber.h"
#include "fuselab_emu_state.h"

#ifdef FUSELAB_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace fuselab_emu {

// A wild pointer in a kernel (an index far outside every tensor, a stack overflow in an emulated thread) faults
// on the CPU. On a GPU that is cudaErrorIllegalAddress; here, without this, it would kill the whole Python
// process (a student's Jupyter kernel). While a block runs, SIGSEGV and SIGBUS jump back to its worker, which
// reports the fault as a launch error naming the kernel, the block and the thread. Faults anywhere else go to
// whatever handler was there before (Python's faulthandler, or the default action). Not under ASan, whose own
// report is the point there.
namespace fault {
static thread_local sigjmp_buf* armed = nullptr;
static thread_local void* address = nullptr;
static struct sigaction previous[2];

static void on_fault(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* target = armed) {
    armed = nullptr;
    address = info ? info->si_addr : nullptr;
    siglongjmp(*target, sig);
  }
  struct sigaction& before = previous[sig == SIGBUS ? 1 : 0];
  if ((before.sa_flags & SA_SIGINFO) && before.sa_sigaction) {
    before.sa_sigaction(sig, info, context);
    return;
  }
  if (!(before.sa_flags & SA_SIGINFO) && before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
    before.sa_handler(sig);
    return;
  }
  struct sigaction fallback;  // the default action: the fault happens again on return, and ends the process
  std::memset(&fallback, 0, sizeof fallback);
  fallback.sa_handler = SIG_DFL;
  sigaction(sig, &fallback, nullptr);
}

static inline bool install() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);  // an empty sa_mask
  action.sa_sigaction = &on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &action, &previous[0]);
  sigaction(SIGBUS, &action, &previous[1]);
  return true;
}

// Once per OS thread: an alternate signal stack, so that a fault on an exhausted fiber stack can be handled.
static inline void prepare_thread() {
#ifndef FUSELAB_EMU_ASAN
  static thread_local bool ready = false;
  if (ready) return;
  ready = true;
  static const bool installed = install();  // once per library
  (void)installed;
  stack_t current;
  if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) return;  // one is set already
  stack_t alt;
  alt.ss_size = 64 * 1024;
  alt.ss_sp = std::malloc(alt.ss_size);
  alt.ss_flags = 0;
  if (alt.ss_sp) sigaltstack(&alt, nullptr);
#endif
}
}  // namespace fault

// Thrown inside kernel code to stop the launch with a CUDA error (__trap, assert, a broken limit).
struct AbortLaunch {
  cudaError_t code;
  std::string message;
};

constexpr std::uint32_t kGarbageWord = 0x7FBADBADu;  // a NaN as float (and as the halves of a double)

static inline void fill_garbage(void* p, std::size_t bytes) {
  unsigned char* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 4 <= bytes; i += 4) std::memcpy(b + i, &kGarbageWord, 4);
  if (i < bytes) std::memcpy(b + i, &kGarbageWord, bytes - i);
}

// ---- process-wide settings of this library ----
enum ThreadOrder { kForward = 0, kReverse = 1, kRandom = 2 };

struct Settings {
  std::atomic<int> order{-1};  // -1: not chosen yet, read FUSELAB_EMU_ORDER at the first launch
  std::atomic<unsigned long long> seed{0};
  std::atomic<unsigned long long> launches_since_order{0};
  std::atomic<int> os_threads{0};  // 0: OpenMP's default
  std::atomic<unsigned long long> launches{0}, loop_blocks{0}, fiber_blocks{0}, switches{0}, fibers{0};
  std::mutex attributes_mutex;
  std::vector<std::pair<std::string, int>> max_dynamic_shared;  // cudaFuncSetAttribute, by kernel name
  std::mutex note_mutex;
  std::string barrier_note;  // the first barrier not reached by every thread of a block, since Python last asked
};

static inline Settings& settings() {
  static Settings s;
  return s;
}

static inline int thread_order() {
  Settings& s = settings();
  int order = s.order.load();
  if (order < 0) {
    order = kForward;
    if (const char* env = std::getenv("FUSELAB_EMU_ORDER")) {
      if (!std::strcmp(env, "reverse")) order = kReverse;
      else if (!std::strcmp(env, "random")) order = kRandom;
    }
    if (const char* env = std::getenv("FUSELAB_EMU_SEED")) s.seed = std::strtoull(env, nullptr, 10);
    int expected = -1;
    s.order.compare_exchange_strong(expected, order);
    order = s.order.load();
  }
  return order;
}

static inline std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ---- one launch, as all workers see it ----
struct LaunchPlan {
  LaunchSite site;
  KernelBody body;
  dim3 grid, block;
  std::size_t dynamic_shared = 0;
  std::size_t shared_limit = kSharedPerBlock;  // static + dynamic
  int order = kForward;
  unsigned long long seed = 0, launch_index = 0;
  std::atomic<int> failed{0};
  std::mutex mutex;
  cudaError_t error = cudaSuccess;
  std::string message;
  std::string barrier_note;  // the launch's first barrier that not every thread of its block reached
  std::atomic<bool> has_barrier_note{false};  // read without the lock: every later divergent barrier skips the words

  void note_barrier(const std::string& note) {
    std::lock_guard<std::mutex> lock(mutex);
    if (barrier_note.empty()) barrier_note = note;
    has_barrier_note = true;
  }

  void fail(cudaError_t code, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed.load()) {
      error = code;
      message = why;
    }
    failed = 1;
  }
};

enum class ThreadState : unsigned char { runnable, at_block_barrier, at_warp_barrier, done };

struct SharedVariable {
  void* address;
  std::size_t bytes;
  unsigned long long generation;
};

// ---- one OS thread's block runner ----
class Worker {
 public:
  LaunchPlan* plan = nullptr;
  int nthreads = 0, nwarps = 0, current = 0;
  bool in_fiber_mode = false;

  ~Worker() {
    for (Fiber* f : all_fibers_) {
      munmap(f->mapping, f->stack_size + (std::size_t)sysconf(_SC_PAGESIZE));
      delete f;
    }
    std::free(dynamic_arena_);
  }

  void begin_launch(LaunchPlan* p) {
    plan = p;
    blockDim = p->block;
    gridDim = p->grid;
    nthreads = (int)(p->block.x * p->block.y * p->block.z);
    nwarps = (nthreads + 31) / 32;
    state_.assign(nthreads, ThreadState::runnable);
    fiber_of_.assign(nthreads, nullptr);
    order_.resize(nthreads);
    warp_live_.assign(nwarps, 0);
    warp_arrived_.assign(nwarps, 0);
    warp_want_.assign(nwarps, 0);
    warp_gen_.assign(nwarps, 0);
    warp_released_.assign(2 * nwarps, 0);
    exchange_.assign((std::size_t)2 * nwarps * 32, kGarbageBits);
    if (!dynamic_arena_) {
      dynamic_arena_ = static_cast<unsigned char*>(std::aligned_alloc(4096, kArenaBytes));
      if (!dynamic_arena_) throw std::bad_alloc();
    }
    switches_ = fiber_blocks_ = loop_blocks_ = 0;
  }

  void end_launch() {
    Settings& s = settings();
    s.switches += switches_;
    s.fiber_blocks += fiber_blocks_;
    s.loop_blocks += loop_blocks_;
    plan = nullptr;
  }

  void run_block(unsigned long long linear) {
    const unsigned long long gx = plan->grid.x, gy = plan->grid.y;
    blockIdx = uint3{(unsigned)(linear % gx), (unsigned)((linear / gx) % gy), (unsigned)(linear / (gx * gy))};
    make_order(linear);
    ++generation_;
    block_static_bytes_ = 0;
    // Shared memory starts as garbage in every block: leftovers of an earlier block must never hide a
    // missing load. The slack past the requested size catches small overruns too.
    fill_garbage(dynamic_arena_, std::min(kArenaBytes, plan->dynamic_shared + 256));
    block_failed_ = false;
    if (plan->site.fibers) {
      ++fiber_blocks_;
    } else {
      ++loop_blocks_;
    }
    run_guarded();
    if (block_failed_) {
      char where[160];
      std::snprintf(where, sizeof where, " [kernel %s launched at %s:%d, block (%u,%u,%u), thread (%u,%u,%u)]",
                    plan->site.kernel, plan->site.file, plan->site.line, blockIdx.x, blockIdx.y, blockIdx.z,
                    failed_thread_.x, failed_thread_.y, failed_thread_.z);
      plan->fail(fail_code_, fail_message_ + where);
    }
  }

  // ---- called from kernel code ----
  void* dynamic_shared() { return dynamic_arena_; }

  void touch_static_shared(void* address, std::size_t bytes) {
    for (SharedVariable& v : statics_) {
      if (v.address == address) {
        if (v.generation == generation_) return;
        v.generation = generation_;
        return first_use_in_block(address, bytes);
      }
    }
    statics_.push_back(SharedVariable{address, bytes, generation_});
    first_use_in_block(address, bytes);
  }

  // __syncthreads and friends. Returns the barrier's phase, for __syncthreads_count.
  // `line`: where the kernel calls it (0: not known).
  unsigned block_barrier(int predicate, const char* what, int line = 0) {
    require_fibers(what);
    const unsigned phase = block_phase_;
    block_count_[phase & 1] += predicate ? 1 : 0;
    state_[current] = ThreadState::at_block_barrier;
    if (block_arrived_ == 0) {
      barrier_line_ = line;
      other_line_ = 0;
    } else if (!barrier_line_) {
      barrier_line_ = line;
    } else if (line && line != barrier_line_ && !other_line_) {
      other_line_ = line;
    }
    ++block_arrived_;
    if (block_arrived_ == live_) release_block();
    yield();
    return phase;
  }
  long long barrier_count(unsigned phase) const { return block_count_[phase & 1]; }
  long long barrier_participants(unsigned phase) const { return block_participants_[phase & 1]; }

  // Every warp-level operation: deposit a value, wait for the lanes named in mask, read the row.
  const std::uint64_t* warp_exchange(unsigned mask, std::uint64_t bits, unsigned* participants,
                                     const char* what) {
    require_fibers(what);
    const int t = current, w = t >> 5, lane = t & 31;
    const unsigned gen = warp_gen_[w];
    std::uint64_t* row = &exchange_[((std::size_t)(gen & 1) * nwarps + w) * 32];
    row[lane] = bits;
    state_[t] = ThreadState::at_warp_barrier;
    warp_arrived_[w] |= 1u << lane;
    warp_want_[w] |= mask;
    try_release_warp(w);
    yield();
    *participants = warp_released_[(gen & 1) * nwarps + w];
    return row;
  }

  unsigned active_mask() const {
    const int w = current >> 5;
    if (in_fiber_mode) return warp_live_[w];
    const int lanes = std::min(32, nthreads - w * 32);
    return lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
  }

  [[noreturn]] void abort_launch(cudaError_t code, const std::string& why) { throw AbortLaunch{code, why}; }

 private:
  // aligned_alloc wants a multiple of the alignment; 4 KB of slack past the largest request.
  static constexpr std::size_t kArenaBytes = (kSharedPerBlockOptin + 4096 + 4095) / 4096 * 4096;

  std::vector<ThreadState> state_;
  std::vector<Fiber*> fiber_of_;
  std::vector<int> order_;
  int live_ = 0, block_arrived_ = 0;
  int barrier_line_ = 0, other_line_ = 0;  // the lines of the current barrier's arrivals: the first, another one
  unsigned block_phase_ = 0;
  long long block_count_[2] = {0, 0}, block_participants_[2] = {0, 0};
  std::vector<unsigned> warp_live_, warp_arrived_, warp_want_, warp_gen_, warp_released_;
  std::vector<std::uint64_t> exchange_;

  SchedulerContext scheduler_;
  std::vector<Fiber*> free_fibers_, all_fibers_;

  unsigned char* dynamic_arena_ = nullptr;
  std::vector<SharedVariable> statics_;
  unsigned long long generation_ = 0;
  std::size_t block_static_bytes_ = 0;

  bool block_failed_ = false;
  cudaError_t fail_code_ = cudaSuccess;
  std::string fail_message_;
  uint3 failed_thread_{0, 0, 0};
  unsigned long long switches_ = 0, fiber_blocks_ = 0, loop_blocks_ = 0;

  uint3 thread_index(int t) const {
    const unsigned bx = plan->block.x, by = plan->block.y;
    return uint3{(unsigned)t % bx, ((unsigned)t / bx) % by, (unsigned)t / (bx * by)};
  }

  void make_order(unsigned long long block_linear) {
    std::iota(order_.begin(), order_.end(), 0);
    if (plan->order == kReverse) {
      std::reverse(order_.begin(), order_.end());
    } else if (plan->order == kRandom) {
      std::uint64_t x = plan->seed * 0x2545F4914F6CDD1Dull ^ (plan->launch_index << 32) ^ block_linear;
      splitmix64(x);
      for (int i = nthreads - 1; i > 0; --i) {
        int j = (int)(splitmix64(x) % (std::uint64_t)(i + 1));
        std::swap(order_[i], order_[j]);
      }
    }
  }

  void first_use_in_block(void* address, std::size_t bytes) {
    fill_garbage(address, bytes);
    block_static_bytes_ += bytes;
    if (block_static_bytes_ > kSharedPerBlock) {
      abort_launch(cudaErrorLaunchOutOfResources,
                   "the kernel declares " + std::to_string(block_static_bytes_) +
                       " bytes of static __shared__ memory; CUDA allows at most " +
                       std::to_string(kSharedPerBlock) +
                       " (nvcc refuses to compile this; use dynamic shared memory with cudaFuncSetAttribute)");
    }
    if (block_static_bytes_ + plan->dynamic_shared > plan->shared_limit) {
      abort_launch(cudaErrorInvalidValue,
                   std::to_string(block_static_bytes_) + " bytes of static plus " +
                       std::to_string(plan->dynamic_shared) + " bytes of dynamic shared memory exceed the " +
                       std::to_string(plan->shared_limit) + " bytes this kernel may use");
    }
  }

  // The block's threads, with a fault (a wild pointer) turned into this block's failure instead of a crash.
  void run_guarded() {
    sigjmp_buf target;
    if (sigsetjmp(target, 1) == 0) {
      fault::armed = &target;
      if (plan->site.fibers) {
        run_with_fibers();
      } else {
        run_as_loop();
      }
      fault::armed = nullptr;
      return;
    }
    // back from a fault: the faulting thread's stack (and every other thread's of this block) is abandoned
    fault::armed = nullptr;
    char where[96];
    std::snprintf(where, sizeof where, "%p", fault::address);
    block_failed_ = false;  // the fault is what this block reports
    record_failure(cudaErrorIllegalAddress,
                   std::string("an illegal memory access: the kernel read or wrote address ") + where +
                       ", outside every tensor (an index computed wrongly: a wrong stride, a missing bounds check, an "
                       "uninitialized variable?), or a stack overflow (deep recursion, a huge local array)");
    recycle_stranded_fibers();
    in_fiber_mode = false;
  }

  void record_failure(cudaError_t code, const std::string& why) {
    if (block_failed_) return;
    block_failed_ = true;
    fail_code_ = code;
    fail_message_ = why;
    failed_thread_ = threadIdx;
  }

  void run_body() {
    try {
      plan->body.invoke(plan->body.context);
    } catch (const AbortLaunch& a) {
      record_failure(a.code, a.message);
    } catch (const std::exception& e) {
      record_failure(cudaErrorLaunchFailure, std::string("a C++ exception escaped the kernel: ") + e.what());
    } catch (...) {
      record_failure(cudaErrorLaunchFailure, "a C++ exception escaped the kernel");
    }
  }

  void require_fibers(const char* what) {
    if (!in_fiber_mode)
      abort_launch(cudaErrorLaunchFailure,
                   std::string(what) + " was reached in a kernel the emulation's translator judged free of "
                   "barriers (is it called through a function pointer?); this is a fuselab limitation");
  }

  void run_as_loop() {
    in_fiber_mode = false;
    for (int k = 0; k < nthreads && !block_failed_; ++k) {
      current = order_[k];
      threadIdx = thread_index(current);
      run_body();
    }
  }

  void run_with_fibers() {
    in_fiber_mode = true;
    std::fill(state_.begin(), state_.end(), ThreadState::runnable);
    live_ = nthreads;
    block_arrived_ = 0;
    block_phase_ = 0;
    block_count_[0] = block_count_[1] = 0;
    for (int w = 0; w < nwarps; ++w) {
      const int lanes = std::min(32, nthreads - w * 32);
      warp_live_[w] = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
      warp_arrived_[w] = warp_want_[w] = warp_gen_[w] = 0;
    }
    while (live_ > 0 && !block_failed_) {
      bool progressed = false;
      for (int k = 0; k < nthreads && !block_failed_; ++k) {
        const int t = order_[k];
        if (state_[t] != ThreadState::runnable) continue;
        resume(t);
        progressed = true;
      }
      if (!progressed && !block_failed_) {
        int at_block = 0, at_warp = 0;
        for (ThreadState s : state_) {
          at_block += s == ThreadState::at_block_barrier;
          at_warp += s == ThreadState::at_warp_barrier;
        }
        failed_thread_ = uint3{0, 0, 0};
        block_failed_ = true;
        fail_code_ = cudaErrorLaunchFailure;
        fail_message_ = "deadlock: " + std::to_string(at_block) + " threads wait at __syncthreads and " +
                        std::to_string(at_warp) +
                        " at a warp operation, and the others have exited (a barrier inside a branch that "
                        "not every thread takes? a shuffle mask naming lanes that never get there?)";
      }
    }
    if (block_failed_) recycle_stranded_fibers();
    in_fiber_mode = false;
  }

  static void fiber_main(void* arg) {
    Worker* w = static_cast<Worker*>(arg);
    fiber_entered(w->scheduler_);
    for (;;) {
      w->run_body();
      Fiber* self = w->fiber_of_[w->current];
      w->thread_exited();
      switch_out(*self, w->scheduler_);  // resumed later to run another thread of some block
    }
  }

  Fiber* acquire_fiber() {
    if (!free_fibers_.empty()) {
      Fiber* f = free_fibers_.back();
      free_fibers_.pop_back();
      return f;
    }
    Fiber* f = new Fiber();
    if (!f->create(&Worker::fiber_main, this)) {
      delete f;
      return nullptr;
    }
    all_fibers_.push_back(f);
    settings().fibers += 1;
    return f;
  }

  void resume(int t) {
    current = t;
    threadIdx = thread_index(t);
    Fiber*& f = fiber_of_[t];
    if (!f) {
      f = acquire_fiber();
      if (!f) {
        record_failure(cudaErrorMemoryAllocation, "could not map a stack for an emulated thread");
        return;
      }
    }
    ++switches_;
    switch_into(scheduler_, *f);
  }

  void yield() {
    ++switches_;
    switch_out(*fiber_of_[current], scheduler_);
  }

  void thread_exited() {
    const int t = current, w = t >> 5;
    state_[t] = ThreadState::done;
    --live_;
    warp_live_[w] &= ~(1u << (t & 31));
    free_fibers_.push_back(fiber_of_[t]);
    fiber_of_[t] = nullptr;
    try_release_warp(w);  // exited threads no longer hold anyone up
    if (live_ > 0 && block_arrived_ == live_) release_block();
  }

  void release_block() {
    if (block_arrived_ < nthreads || other_line_) note_divergent_barrier();
    for (int t = 0; t < nthreads; ++t)
      if (state_[t] == ThreadState::at_block_barrier) state_[t] = ThreadState::runnable;
    block_participants_[block_phase_ & 1] = block_arrived_;
    block_arrived_ = 0;
    ++block_phase_;
    block_count_[block_phase_ & 1] = 0;
  }

  void try_release_warp(int w) {
    const unsigned arrived = warp_arrived_[w];
    if (!arrived) return;
    const unsigned need = warp_want_[w] & warp_live_[w];
    if (need & ~arrived) return;
    for (int lane = 0; lane < 32; ++lane)
      if (arrived & (1u << lane)) state_[w * 32 + lane] = ThreadState::runnable;
    warp_released_[(warp_gen_[w] & 1) * nwarps + w] = arrived;
    warp_arrived_[w] = 0;
    warp_want_[w] = 0;
    ++warp_gen_[w];
  }

  // A barrier released although not every thread of the block waited at it: some had exited (a `return` before
  // it, a barrier inside an `if`), or they waited at another __syncthreads() of the kernel. CUDA requires every
  // thread of the block to reach the same barrier; the emulation, like a current GPU, lets the others go on.
  void note_divergent_barrier() {
    if (plan->has_barrier_note.load(std::memory_order_relaxed)) return;
    auto at = [](int line) {
      return line ? "the __syncthreads() at line " + std::to_string(line) : std::string("a barrier");
    };
    char block[64];
    std::snprintf(block, sizeof block, "block (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
    std::string note;
    if (other_line_) {
      note = "in " + std::string(block) + " of kernel " + plan->site.kernel + ", threads met at two different " +
             "barriers, " + at(barrier_line_) + " and " + at(other_line_) + ": a __syncthreads() inside a branch " +
             "that not every thread of the block takes";
    } else {
      note = at(barrier_line_) + " of kernel " + plan->site.kernel + " was passed by " +
             std::to_string(block_arrived_) + " of the " + std::to_string(nthreads) + " threads of " + block +
             "; the other " + std::to_string(nthreads - block_arrived_) + " had exited without reaching it " +
             "(a barrier inside an `if` that not every thread takes, or a `return` before it)";
    }
    plan->note_barrier(note);
  }

  // After a failed block, threads still parked mid-kernel are abandoned: rewind their fibers.
  void recycle_stranded_fibers() {
    for (int t = 0; t < nthreads; ++t) {
      if (Fiber* f = fiber_of_[t]) {
#ifdef FUSELAB_EMU_ASAN
        __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
        f->reset();
        free_fibers_.push_back(f);
        fiber_of_[t] = nullptr;
      }
    }
  }
};

static thread_local Worker* tls_worker = nullptr;  // set while this OS thread runs blocks of a launch

static inline Worker& worker_for_this_thread() {
  static thread_local std::unique_ptr<Worker> w;
  if (!w) w.reset(new Worker());
  return *w;
}

static inline Worker& current_worker(const char* what) {
  if (!tls_worker) {
    std::fprintf(stderr, "fuselab emulation: %s called outside a kernel\n", what);
    std::abort();
  }
  return *tls_worker;
}

// ---- launching ----
static inline std::size_t max_dynamic_shared_for(const char* kernel) {
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.attributes_mutex);
  for (auto& entry : s.max_dynamic_shared)
    if (entry.first == kernel) return (std::size_t)entry.second;
  for (auto& entry : s.max_dynamic_shared)
    if (entry.first == "*") return (std::size_t)entry.second;
  return kSharedPerBlock;
}

static inline std::string describe(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

// Checks a launch configuration as the CUDA runtime does; returns an empty string when it is valid.
static inline std::string check_configuration(dim3 grid, dim3 block, cudaError_t* code) {
  *code = cudaErrorInvalidConfiguration;
  const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0)
    return "block " + describe(block) + " has a zero dimension";
  if (block.x > kMaxBlockX || block.y > kMaxBlockY || block.z > kMaxBlockZ)
    return "block " + describe(block) + " exceeds CUDA's limits (1024, 1024, 64)";
  if (threads > kMaxThreadsPerBlock)
    return "block " + describe(block) + " has " + std::to_string(threads) +
           " threads; CUDA allows at most 1024 per block";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "grid " + describe(grid) + " has a zero dimension";
  if (grid.x > kMaxGridX || grid.y > kMaxGridY || grid.z > kMaxGridZ)
    return "grid " + describe(grid) + " exceeds CUDA's limits (2147483647, 65535, 65535)";
  return "";
}

void launch_kernel(const LaunchSite& site, dim3 grid, dim3 block, std::size_t dynamic_shared, cudaStream_t stream,
                   KernelBody body) {
  if (!on_given_stream(stream, std::string("kernel ") + site.kernel + " launched at " + site.file + ":" +
                                   std::to_string(site.line))) {
    return;  // like a CUDA graph's replay: work on another stream is not part of the caller's
  }
  cudaError_t code;
  std::string why = check_configuration(grid, block, &code);
  const std::size_t limit = max_dynamic_shared_for(site.kernel);
  if (why.empty() && dynamic_shared > limit) {
    code = cudaErrorInvalidValue;
    why = std::to_string(dynamic_shared) + " bytes of dynamic shared memory requested; this kernel may use " +
          std::to_string(limit) +
          (limit == kSharedPerBlock
               ? " (above 48 KB, call cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                 "bytes) first)"
               : "");
  }
  if (!why.empty()) {
    char where[128];
    std::snprintf(where, sizeof where, " [kernel %s launched at %s:%d]", site.kernel, site.file, site.line);
    record_error(code, why + where);
    return;  // like CUDA: the kernel does not run
  }

  Settings& s = settings();
  LaunchPlan plan;
  plan.site = site;
  plan.body = body;
  plan.grid = grid;
  plan.block = block;
  plan.dynamic_shared = dynamic_shared;
  plan.shared_limit = std::max(limit, kSharedPerBlock);
  plan.order = thread_order();
  plan.seed = s.seed.load();
  plan.launch_index = s.launches_since_order++;
  s.launches += 1;

  const long long blocks = (long long)grid.x * grid.y * grid.z;
  int os_threads = s.os_threads.load();
  if (os_threads <= 0) os_threads = omp_get_max_threads();
  if ((long long)os_threads > blocks) os_threads = (int)blocks;
  DeviceAccess access;  // the kernel's blocks may touch device memory; the launcher around them may not
#pragma omp parallel num_threads(os_threads) if (os_threads > 1)
  {
    fault::prepare_thread();
    Worker& w = worker_for_this_thread();
    Worker* outer = tls_worker;
    tls_worker = &w;
    try {
      w.begin_launch(&plan);
#pragma omp for schedule(dynamic, 1)
      for (long long b = 0; b < blocks; ++b) {
        if (plan.failed.load(std::memory_order_relaxed)) continue;
        w.run_block((unsigned long long)b);
      }
    } catch (const std::bad_alloc&) {
      plan.fail(cudaErrorMemoryAllocation, "the emulation ran out of host memory");
    }
    w.end_launch();
    tls_worker = outer;
  }
  if (plan.failed.load()) record_error(plan.error, plan.message, /*during_execution=*/true);
  if (!plan.barrier_note.empty()) {
    std::lock_guard<std::mutex> lock(s.note_mutex);
    if (s.barrier_note.empty()) s.barrier_note = plan.barrier_note;
  }
}

// What the translator makes of a `__shared__` declaration: register it, fill it with garbage the first
// time each block reaches it.
void shared_static(void* address, std::size_t bytes) {
  if (tls_worker) tls_worker->touch_static_shared(address, bytes);
}

void* dynamic_shared_memory() { return tls_worker ? tls_worker->dynamic_shared() : nullptr; }

cudaError_t set_function_attribute(const char* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    record_error(cudaErrorInvalidValue, "this function attribute is not emulated");
    return cudaErrorInvalidValue;
  }
  if (value < 0 || (std::size_t)value > kSharedPerBlockOptin) {
    record_error(cudaErrorInvalidValue, "cudaFuncAttributeMaxDynamicSharedMemorySize " + std::to_string(value) +
                                            " is above the device's 232448 bytes (227 KB)");
    return cudaErrorInvalidValue;
  }
  Settings& s = settings();
  std::lock_guard<std::mutex> lock(s.attributes_mutex);
  for (auto& entry : s.max_dynamic_shared) {
    if (entry.first == kernel) {
      entry.second = value;
      return cudaSuccess;
    }
  }
  s.max_dynamic_shared.emplace_back(kernel, value);
  return cudaSuccess;
}

[[noreturn]] void assert_fail(const char* expression, const char* file, int line) {
  if (!tls_worker) {
    std::fprintf(stderr, "%s:%d: Assertion `%s' failed.\n", file, line, expression);
    std::abort();
  }
  std::fprintf(stderr, "%s:%d: block: [%u,%u,%u], thread: [%u,%u,%u] Assertion `%s` failed.\n", file, line,
               blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z, expression);
  throw AbortLaunch{cudaErrorAssert, std::string("assert(") + expression + ") failed at " + file + ":" +
                                         std::to_string(line)};
}

}  // namespace fuselab_emu
