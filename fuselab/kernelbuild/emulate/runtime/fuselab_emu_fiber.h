// fuselab CPU emulation: fibers, one per emulated CUDA thread that may wait at a barrier.
//
// A context switch happens at every __syncthreads and warp shuffle, so it must be cheap. glibc's
// swapcontext saves the signal mask with a system call on every switch; instead we switch with a few
// instructions that save the callee-saved registers and the stack pointer (x86-64 and aarch64), and
// keep ucontext as the portable fallback (-DFUSELAB_EMU_UCONTEXT forces it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(FUSELAB_EMU_UCONTEXT) && !defined(__x86_64__) && !defined(__aarch64__)
#define FUSELAB_EMU_UCONTEXT 1
#endif

#ifdef FUSELAB_EMU_UCONTEXT
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define FUSELAB_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUSELAB_EMU_ASAN 1
#endif
#endif

#ifdef FUSELAB_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#ifndef FUSELAB_EMU_UCONTEXT
// fuselab_emu_switch(save, load): push callee-saved registers, store sp into *save, load sp, pop, return.
// fuselab_emu_fiber_start: the first "return address" of a fresh fiber; calls entry(arg), never returns.
// Hidden visibility: each student library carries its own copy, and none interposes on another's.
extern "C" void fuselab_emu_switch(void** save_sp, void* load_sp);
extern "C" void fuselab_emu_fiber_start();
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl fuselab_emu_switch\n"
    ".hidden fuselab_emu_switch\n"
    ".type fuselab_emu_switch,@function\n"
    ".p2align 4\n"
    "fuselab_emu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size fuselab_emu_switch,.-fuselab_emu_switch\n"
    ".globl fuselab_emu_fiber_start\n"
    ".hidden fuselab_emu_fiber_start\n"
    ".type fuselab_emu_fiber_start,@function\n"
    ".p2align 4\n"
    "fuselab_emu_fiber_start:\n"
    "  .cfi_startproc\n"
    "  .cfi_undefined rip\n"  // tells unwinders and debuggers: the fiber's stack ends here
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    "  .cfi_endproc\n"
    ".size fuselab_emu_fiber_start,.-fuselab_emu_fiber_start\n");
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".globl fuselab_emu_switch\n"
    ".hidden fuselab_emu_switch\n"
    ".type fuselab_emu_switch,%function\n"
    ".p2align 4\n"
    "fuselab_emu_switch:\n"
    "  hint #34\n"  // bti c: a valid landing pad where branch protection is enforced
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n"
    "  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n"
    "  ret\n"
    ".size fuselab_emu_switch,.-fuselab_emu_switch\n"
    ".globl fuselab_emu_fiber_start\n"
    ".hidden fuselab_emu_fiber_start\n"
    ".type fuselab_emu_fiber_start,%function\n"
    ".p2align 4\n"
    "fuselab_emu_fiber_start:\n"
    "  .cfi_startproc\n"
    "  .cfi_undefined x30\n"
    "  hint #34\n"
    "  mov x0, x19\n"
    "  blr x20\n"
    "  brk #0\n"
    "  .cfi_endproc\n"
    ".size fuselab_emu_fiber_start,.-fuselab_emu_fiber_start\n");
#endif
#endif  // !FUSELAB_EMU_UCONTEXT

namespace fuselab_emu {

using FiberEntry = void (*)(void*);

inline std::size_t fiber_stack_bytes() {
  static const std::size_t bytes = [] {
    std::size_t kb = 256;
#ifdef FUSELAB_EMU_ASAN
    kb = 1024;  // instrumented frames are several times larger
#endif
    if (const char* env = std::getenv("FUSELAB_EMU_STACK_KB")) {
      long v = std::atol(env);
      if (v >= 16) kb = (std::size_t)v;
    }
    return kb * 1024;
  }();
  return bytes;
}

// A fiber owns a stack (with a guard page below it, so that an overflow faults instead of corrupting a
// neighbour) and a saved context.
struct Fiber {
  char* mapping = nullptr;  // guard page + stack
  char* stack_lo = nullptr;
  std::size_t stack_size = 0;
  FiberEntry entry = nullptr;
  void* arg = nullptr;
#ifdef FUSELAB_EMU_UCONTEXT
  ucontext_t context;
#else
  void* sp = nullptr;
#endif
#ifdef FUSELAB_EMU_ASAN
  void* fake_stack = nullptr;
#endif

  bool create(FiberEntry fn, void* a) {
    const std::size_t page = (std::size_t)sysconf(_SC_PAGESIZE);
    stack_size = (fiber_stack_bytes() + page - 1) / page * page;
    void* m = mmap(nullptr, stack_size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return false;
    mapping = (char*)m;
    mprotect(mapping, page, PROT_NONE);
    stack_lo = mapping + page;
    entry = fn;
    arg = a;
    reset();
    return true;
  }

  // Put the fiber back at the start of its entry function (used after an aborted block).
  void reset() {
#ifdef FUSELAB_EMU_UCONTEXT
    getcontext(&context);
    context.uc_stack.ss_sp = stack_lo;
    context.uc_stack.ss_size = stack_size;
    context.uc_link = nullptr;
    // makecontext passes int arguments only: split the pointer.
    std::uintptr_t p = (std::uintptr_t)this;
    makecontext(&context, (void (*)())&ucontext_trampoline, 2, (unsigned)(p & 0xffffffffu),
                (unsigned)(p >> 32));
#else
    std::uintptr_t top = ((std::uintptr_t)(stack_lo + stack_size)) & ~(std::uintptr_t)15;
#if defined(__x86_64__)
    // Layout popped by fuselab_emu_switch: r15 r14 r13 r12 rbx rbp, then the return address.
    // sp + 56 must be 16-byte aligned when fiber_start calls the entry.
    void** frame = (void**)(top - 72);
    frame[0] = nullptr;         // r15
    frame[1] = nullptr;         // r14
    frame[2] = (void*)entry;    // r13
    frame[3] = arg;             // r12
    frame[4] = nullptr;         // rbx
    frame[5] = nullptr;         // rbp
    frame[6] = (void*)&fuselab_emu_fiber_start;
    frame[7] = nullptr;
    frame[8] = nullptr;
    sp = frame;
#else
    void** frame = (void**)(top - 176);
    for (int i = 0; i < 22; ++i) frame[i] = nullptr;
    frame[0] = arg;                                 // x19
    frame[1] = (void*)entry;                        // x20
    frame[11] = (void*)&fuselab_emu_fiber_start;   // x30
    sp = frame;
#endif
#endif
  }

#ifdef FUSELAB_EMU_UCONTEXT
  static void ucontext_trampoline(unsigned lo, unsigned hi) {
    Fiber* self = (Fiber*)(((std::uintptr_t)hi << 32) | (std::uintptr_t)lo);
    self->entry(self->arg);
    std::abort();
  }
#endif
};

// The scheduler side of a switch: the OS thread's own stack.
struct SchedulerContext {
#ifdef FUSELAB_EMU_UCONTEXT
  ucontext_t context;
#else
  void* sp = nullptr;
#endif
#ifdef FUSELAB_EMU_ASAN
  const void* stack_lo = nullptr;
  std::size_t stack_size = 0;
#endif
};

inline void switch_into(SchedulerContext& sched, Fiber& f) {
#ifdef FUSELAB_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack_lo, f.stack_size);
#endif
#ifdef FUSELAB_EMU_UCONTEXT
  swapcontext(&sched.context, &f.context);
#else
  fuselab_emu_switch(&sched.sp, f.sp);
#endif
#ifdef FUSELAB_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

inline void switch_out(Fiber& f, SchedulerContext& sched) {
#ifdef FUSELAB_EMU_ASAN
  __sanitizer_start_switch_fiber(&f.fake_stack, sched.stack_lo, sched.stack_size);
#endif
#ifdef FUSELAB_EMU_UCONTEXT
  swapcontext(&f.context, &sched.context);
#else
  fuselab_emu_switch(&f.sp, sched.sp);
#endif
#ifdef FUSELAB_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &sched.stack_lo, &sched.stack_size);
#endif
}

// Called first thing on a fresh fiber, so that the sanitizer learns the scheduler's stack.
inline void fiber_entered(SchedulerContext& sched) {
#ifdef FUSELAB_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sched.stack_lo, &sched.stack_size);
#else
  (void)sched;
#endif
}

}  // namespace fuselab_emu
