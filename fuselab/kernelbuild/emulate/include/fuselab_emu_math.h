// fuselab CPU emulation: CUDA's device math functions, intrinsics and atomics.
//
// The fast-math intrinsics (__expf, __fdividef, ...) are computed at full precision: the emulation checks
// what a kernel computes, and a reference tolerance that passes on the GPU passes here too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>

#include "fuselab_emu_half.h"

// ---- min/max: CUDA declares these overloads in the global namespace ----
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
static inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(float a, double b) { return fmin((double)a, b); }
static inline double max(float a, double b) { return fmax((double)a, b); }
static inline double min(double a, float b) { return fmin(a, (double)b); }
static inline double max(double a, float b) { return fmax(a, (double)b); }
static inline unsigned int umin(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int umax(unsigned int a, unsigned int b) { return a > b ? a : b; }

// ---- float intrinsics ----
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
// glibc declares these names itself (as plain libm entry points), so ours get other names and a macro.
#define __expf fuselab_emu__expf
#define __exp10f fuselab_emu__exp10f
#define __logf fuselab_emu__logf
#define __log2f fuselab_emu__log2f
#define __log10f fuselab_emu__log10f
#define __sinf fuselab_emu__sinf
#define __cosf fuselab_emu__cosf
#define __tanf fuselab_emu__tanf
#define __sincosf fuselab_emu__sincosf
#define __powf fuselab_emu__powf
static inline float fuselab_emu__expf(float x) { return expf(x); }
static inline float fuselab_emu__exp10f(float x) { return powf(10.0f, x); }
static inline float fuselab_emu__logf(float x) { return logf(x); }
static inline float fuselab_emu__log2f(float x) { return log2f(x); }
static inline float fuselab_emu__log10f(float x) { return log10f(x); }
static inline float fuselab_emu__sinf(float x) { return sinf(x); }
static inline float fuselab_emu__cosf(float x) { return cosf(x); }
static inline float fuselab_emu__tanf(float x) { return tanf(x); }
static inline void fuselab_emu__sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
static inline float fuselab_emu__powf(float x, float y) { return powf(x, y); }
static inline float __fdividef(float x, float y) { return x / y; }
static inline float fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
static inline float saturate(float x) { return __saturatef(x); }
static inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
static inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }

// ---- conversions and reinterpretations ----
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned int __float2uint_rn(float x) { return (unsigned int)nearbyintf(x); }
static inline unsigned int __float2uint_rz(float x) { return (unsigned int)x; }
static inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
static inline long long __float2ll_rz(float x) { return (long long)x; }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned int x) { return (float)x; }
static inline float __ll2float_rn(long long x) { return (float)x; }
static inline double __int2double_rn(int x) { return (double)x; }
static inline float __double2float_rn(double x) { return (float)x; }
static inline int __double2int_rn(double x) { return (int)nearbyint(x); }
static inline int __double2int_rz(double x) { return (int)x; }
static inline int __float_as_int(float x) { int r; std::memcpy(&r, &x, 4); return r; }
static inline unsigned int __float_as_uint(float x) { unsigned int r; std::memcpy(&r, &x, 4); return r; }
static inline float __int_as_float(int x) { float r; std::memcpy(&r, &x, 4); return r; }
static inline float __uint_as_float(unsigned int x) { float r; std::memcpy(&r, &x, 4); return r; }
static inline long long __double_as_longlong(double x) { long long r; std::memcpy(&r, &x, 8); return r; }
static inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }

// ---- integer intrinsics ----
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
static inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
static inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xffffffu) * (b & 0xffffffu); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * (long long)b) >> 32); }
static inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return (unsigned int)(((unsigned long long)a * (unsigned long long)b) >> 32);
}
static inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * (__int128)b) >> 64); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
}
static inline unsigned int __sad(int a, int b, unsigned int c) { return (unsigned int)(a > b ? a - b : b - a) + c; }

// ---- cache-hinted loads and stores: plain memory accesses on the CPU ----
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcg(const T* p) { return *p; }
template <class T> static inline T __ldca(const T* p) { return *p; }
template <class T> static inline T __ldcs(const T* p) { return *p; }
template <class T> static inline T __ldlu(const T* p) { return *p; }
template <class T> static inline T __ldcv(const T* p) { return *p; }
template <class T> static inline void __stcg(T* p, T v) { *p = v; }
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
template <class T> static inline void __stwb(T* p, T v) { *p = v; }
template <class T> static inline void __stwt(T* p, T v) { *p = v; }

// ---- memory fences and clocks ----
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
namespace fuselab_emu {
FUSELAB_EMU_RUNTIME_API long long clock_ns();  // steady clock, in the runtime (no <chrono> here)
}
static inline long long clock64() { return fuselab_emu::clock_ns(); }
static inline unsigned long long __globaltimer() { return (unsigned long long)clock64(); }

// ---- atomics: real atomic instructions, since blocks run on several OS threads at once ----
namespace fuselab_emu {
template <class T, class Bits, class Op>
static inline T atomic_update(T* address, Op op) {
  static_assert(sizeof(T) == sizeof(Bits), "atomic width");
  Bits* p = reinterpret_cast<Bits*>(address);
  Bits old_bits = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    T old_value;
    std::memcpy(&old_value, &old_bits, sizeof(T));
    T new_value = op(old_value);
    Bits new_bits;
    std::memcpy(&new_bits, &new_value, sizeof(T));
    if (__atomic_compare_exchange_n(p, &old_bits, new_bits, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
      return old_value;
  }
}
}  // namespace fuselab_emu

#define FUSELAB_EMU_INT_ATOMICS(T)                                                                       \
  static inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }          \
  static inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }          \
  static inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }        \
  static inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }          \
  static inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }            \
  static inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }          \
  static inline T atomicMin(T* a, T v) {                                                                \
    return fuselab_emu::atomic_update<T, T>(a, [v](T o) { return v < o ? v : o; });                     \
  }                                                                                                     \
  static inline T atomicMax(T* a, T v) {                                                                \
    return fuselab_emu::atomic_update<T, T>(a, [v](T o) { return v > o ? v : o; });                     \
  }                                                                                                     \
  static inline T atomicCAS(T* a, T compare, T v) {                                                     \
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);             \
    return compare;                                                                                     \
  }

FUSELAB_EMU_INT_ATOMICS(int)
FUSELAB_EMU_INT_ATOMICS(unsigned int)
FUSELAB_EMU_INT_ATOMICS(long long)
FUSELAB_EMU_INT_ATOMICS(unsigned long long)
#undef FUSELAB_EMU_INT_ATOMICS

static inline unsigned short atomicCAS(unsigned short* a, unsigned short compare, unsigned short v) {
  __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
static inline float atomicAdd(float* a, float v) {
  return fuselab_emu::atomic_update<float, std::uint32_t>(a, [v](float o) { return o + v; });
}
static inline double atomicAdd(double* a, double v) {
  return fuselab_emu::atomic_update<double, std::uint64_t>(a, [v](double o) { return o + v; });
}
static inline __half atomicAdd(__half* a, __half v) {
  return fuselab_emu::atomic_update<__half, std::uint16_t>(a, [v](__half o) { return __hadd(o, v); });
}
static inline float atomicExch(float* a, float v) {
  return fuselab_emu::atomic_update<float, std::uint32_t>(a, [v](float) { return v; });
}
static inline unsigned int atomicInc(unsigned int* a, unsigned int limit) {
  return fuselab_emu::atomic_update<unsigned int, unsigned int>(
      a, [limit](unsigned int o) { return o >= limit ? 0u : o + 1u; });
}
static inline unsigned int atomicDec(unsigned int* a, unsigned int limit) {
  return fuselab_emu::atomic_update<unsigned int, unsigned int>(
      a, [limit](unsigned int o) { return (o == 0u || o > limit) ? limit : o - 1u; });
}

// Scoped variants: on the CPU every atomic is system-wide.
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicSub_block atomicSub
#define atomicExch_block atomicExch
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicCAS_block atomicCAS
#define atomicAnd_block atomicAnd
#define atomicOr_block atomicOr
