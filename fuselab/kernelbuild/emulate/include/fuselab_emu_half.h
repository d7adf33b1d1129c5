// fuselab CPU emulation: __half and __nv_bfloat16 as 16-bit storage types.
//
// Conversions are done in software with round-to-nearest-even, so they give the same bits as the GPU on
// every CPU (no F16C or aarch64 FP16 instructions needed). Arithmetic is done in float and rounded
// back, which is what the GPU's half instructions compute for + and *.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fuselab_emu_types.h"

namespace fuselab_emu {

inline unsigned short float_to_half_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan (keep nan quiet and its top payload bits)
    return (unsigned short)(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax <= 0x33000000u) return (unsigned short)sign;              // <= 2^-25 rounds to zero (tie to even)
  if (ax < 0x38800000u) {                                          // half subnormal
    const std::uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 126 - (int)(ax >> 23);  // 14..24
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return (unsigned short)(sign | q);
  }
  std::uint32_t h = (ax - 0x38000000u) >> 13;
  const std::uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return (unsigned short)(sign | h);
}

inline float half_bits_to_float(unsigned short h) {
  const std::uint32_t sign = (std::uint32_t)(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      float v = (float)mant * 5.9604644775390625e-8f;  // mant * 2^-24, exact
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline unsigned short float_to_bf16_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return (unsigned short)(x >> 16);
}

inline float bf16_bits_to_float(unsigned short b) {
  std::uint32_t x = (std::uint32_t)b << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace fuselab_emu

struct __half_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  __half(__half_raw r) : __x(r.x) {}
  __half(float f) : __x(fuselab_emu::float_to_half_bits(f)) {}
  __half(double d) : __x(fuselab_emu::float_to_half_bits((float)d)) {}
  __half(int i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(unsigned int i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(long i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(unsigned long i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(long long i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(unsigned long long i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(short i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  __half(unsigned short i) : __x(fuselab_emu::float_to_half_bits((float)i)) {}
  operator float() const { return fuselab_emu::half_bits_to_float(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
  __half& operator=(float f) { __x = fuselab_emu::float_to_half_bits(f); return *this; }
  __half& operator=(double d) { __x = fuselab_emu::float_to_half_bits((float)d); return *this; }
  __half& operator=(int i) { __x = fuselab_emu::float_to_half_bits((float)i); return *this; }
};
typedef __half half;

struct alignas(4) __half2 {
  __half x, y;
};
typedef __half2 half2;

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(fuselab_emu::float_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(fuselab_emu::float_to_bf16_bits((float)d)) {}
  __nv_bfloat16(int i) : __x(fuselab_emu::float_to_bf16_bits((float)i)) {}
  operator float() const { return fuselab_emu::bf16_bits_to_float(__x); }
  __nv_bfloat16& operator=(float f) { __x = fuselab_emu::float_to_bf16_bits(f); return *this; }
};
typedef __nv_bfloat16 nv_bfloat16;

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
typedef __nv_bfloat162 nv_bfloat162;

// ---- half: conversions and arithmetic ----
static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline __half __double2half(double d) { return __half((float)d); }
static inline float __half2float(__half h) { return (float)h; }
static inline __half __int2half_rn(int i) { return __half((float)i); }
static inline int __half2int_rz(__half h) { return (int)(float)h; }
static inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }
static inline short __half_as_short(__half h) { return (short)h.__x; }

static inline __half __hadd(__half a, __half b) { return __half((float)a + (float)b); }
static inline __half __hsub(__half a, __half b) { return __half((float)a - (float)b); }
static inline __half __hmul(__half a, __half b) { return __half((float)a * (float)b); }
static inline __half __hdiv(__half a, __half b) { return __half((float)a / (float)b); }
static inline __half __hneg(__half a) { return __half_raw{(unsigned short)(a.__x ^ 0x8000u)}; }
static inline __half __habs(__half a) { return __half_raw{(unsigned short)(a.__x & 0x7fffu)}; }
static inline __half __hfma(__half a, __half b, __half c) {
  return __half((float)((double)(float)a * (double)(float)b + (double)(float)c));
}
static inline __half __hmax(__half a, __half b) { return (float)a > (float)b ? a : b; }
static inline __half __hmin(__half a, __half b) { return (float)a < (float)b ? a : b; }
static inline bool __heq(__half a, __half b) { return (float)a == (float)b; }
static inline bool __hne(__half a, __half b) { return (float)a != (float)b; }
static inline bool __hlt(__half a, __half b) { return (float)a < (float)b; }
static inline bool __hle(__half a, __half b) { return (float)a <= (float)b; }
static inline bool __hgt(__half a, __half b) { return (float)a > (float)b; }
static inline bool __hge(__half a, __half b) { return (float)a >= (float)b; }
static inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
static inline int __hisinf(__half a) {
  return (a.__x & 0x7fffu) == 0x7c00u ? ((a.__x & 0x8000u) ? -1 : 1) : 0;
}
static inline __half hsqrt(__half a) { return __half(std::sqrt((float)a)); }
static inline __half hexp(__half a) { return __half(std::exp((float)a)); }

static inline __half operator+(const __half& a, const __half& b) { return __hadd(a, b); }
static inline __half operator-(const __half& a, const __half& b) { return __hsub(a, b); }
static inline __half operator*(const __half& a, const __half& b) { return __hmul(a, b); }
static inline __half operator/(const __half& a, const __half& b) { return __hdiv(a, b); }
static inline __half operator-(const __half& a) { return __hneg(a); }
static inline __half operator+(const __half& a) { return a; }
static inline __half& operator+=(__half& a, const __half& b) { return a = __hadd(a, b); }
static inline __half& operator-=(__half& a, const __half& b) { return a = __hsub(a, b); }
static inline __half& operator*=(__half& a, const __half& b) { return a = __hmul(a, b); }
static inline __half& operator/=(__half& a, const __half& b) { return a = __hdiv(a, b); }
static inline bool operator==(const __half& a, const __half& b) { return __heq(a, b); }
static inline bool operator!=(const __half& a, const __half& b) { return __hne(a, b); }
static inline bool operator<(const __half& a, const __half& b) { return __hlt(a, b); }
static inline bool operator<=(const __half& a, const __half& b) { return __hle(a, b); }
static inline bool operator>(const __half& a, const __half& b) { return __hgt(a, b); }
static inline bool operator>=(const __half& a, const __half& b) { return __hge(a, b); }

// ---- half2 ----
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
static inline __half2 __half2half2(__half a) { return __half2{a, a}; }
static inline __half2 make_half2(__half a, __half b) { return __half2{a, b}; }
static inline __half2 __float2half2_rn(float f) { return __half2{__half(f), __half(f)}; }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
static inline __half2 __float22half2_rn(float2 v) { return __half2{__half(v.x), __half(v.y)}; }
static inline float2 __half22float2(__half2 h) { return float2{(float)h.x, (float)h.y}; }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
static inline float __low2float(__half2 h) { return (float)h.x; }
static inline float __high2float(__half2 h) { return (float)h.y; }
static inline __half2 __hadd2(__half2 a, __half2 b) { return __half2{__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
static inline __half2 __hsub2(__half2 a, __half2 b) { return __half2{__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __half2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
static inline __half2 __hmax2(__half2 a, __half2 b) { return __half2{__hmax(a.x, b.x), __hmax(a.y, b.y)}; }
static inline __half2 __hmin2(__half2 a, __half2 b) { return __half2{__hmin(a.x, b.x), __hmin(a.y, b.y)}; }
static inline __half2 operator+(const __half2& a, const __half2& b) { return __hadd2(a, b); }
static inline __half2 operator-(const __half2& a, const __half2& b) { return __hsub2(a, b); }
static inline __half2 operator*(const __half2& a, const __half2& b) { return __hmul2(a, b); }

// ---- bfloat16 ----
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return (float)b; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a + (float)b); }
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a * (float)b); }
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat16((float)a - (float)b); }
static inline __nv_bfloat16 operator+(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hadd(a, b); }
static inline __nv_bfloat16 operator-(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hsub(a, b); }
static inline __nv_bfloat16 operator*(const __nv_bfloat16& a, const __nv_bfloat16& b) { return __hmul(a, b); }
static inline __nv_bfloat16 operator/(const __nv_bfloat16& a, const __nv_bfloat16& b) {
  return __nv_bfloat16((float)a / (float)b);
}
static inline bool operator<(const __nv_bfloat16& a, const __nv_bfloat16& b) { return (float)a < (float)b; }
static inline bool operator>(const __nv_bfloat16& a, const __nv_bfloat16& b) { return (float)a > (float)b; }
static inline bool operator==(const __nv_bfloat16& a, const __nv_bfloat16& b) { return (float)a == (float)b; }
static inline bool operator!=(const __nv_bfloat16& a, const __nv_bfloat16& b) { return (float)a != (float)b; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{(float)h.x, (float)h.y}; }
