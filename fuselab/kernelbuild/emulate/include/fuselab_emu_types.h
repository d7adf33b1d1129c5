// fuselab CPU emulation: CUDA's built-in vector types, dim3 and the launch-configuration values.
#pragma once

#include <cstddef>

// A function of the emulation's runtime (fuselab/kernelbuild/emulate/runtime/), compiled once and linked into every
// emulated library: hidden, so each library calls its own copy and keeps its own state.
#define FUSELAB_EMU_RUNTIME_API __attribute__((visibility("hidden")))

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// The alignment of each type is CUDA's: it matters for vectorized loads through reinterpret_cast.
#define FUSELAB_EMU_VEC2(T, NAME, ALIGN)                                  \
  struct alignas(ALIGN) NAME { T x, y; };                                 \
  static inline NAME make_##NAME(T x, T y) { return NAME{x, y}; }
#define FUSELAB_EMU_VEC3(T, NAME)                                         \
  struct NAME { T x, y, z; };                                             \
  static inline NAME make_##NAME(T x, T y, T z) { return NAME{x, y, z}; }
#define FUSELAB_EMU_VEC4(T, NAME, ALIGN)                                  \
  struct alignas(ALIGN) NAME { T x, y, z, w; };                           \
  static inline NAME make_##NAME(T x, T y, T z, T w) { return NAME{x, y, z, w}; }

FUSELAB_EMU_VEC2(float, float2, 8)
FUSELAB_EMU_VEC3(float, float3)
FUSELAB_EMU_VEC4(float, float4, 16)
FUSELAB_EMU_VEC2(double, double2, 16)
FUSELAB_EMU_VEC3(double, double3)
FUSELAB_EMU_VEC4(double, double4, 16)
FUSELAB_EMU_VEC2(int, int2, 8)
FUSELAB_EMU_VEC3(int, int3)
FUSELAB_EMU_VEC4(int, int4, 16)
FUSELAB_EMU_VEC2(unsigned int, uint2, 8)
FUSELAB_EMU_VEC4(unsigned int, uint4, 16)
FUSELAB_EMU_VEC2(short, short2, 4)
FUSELAB_EMU_VEC4(short, short4, 8)
FUSELAB_EMU_VEC2(unsigned short, ushort2, 4)
FUSELAB_EMU_VEC4(unsigned short, ushort4, 8)
FUSELAB_EMU_VEC2(signed char, char2, 2)
FUSELAB_EMU_VEC4(signed char, char4, 4)
FUSELAB_EMU_VEC2(unsigned char, uchar2, 2)
FUSELAB_EMU_VEC4(unsigned char, uchar4, 4)
FUSELAB_EMU_VEC2(long long, longlong2, 16)
FUSELAB_EMU_VEC2(unsigned long long, ulonglong2, 16)

static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }

#undef FUSELAB_EMU_VEC2
#undef FUSELAB_EMU_VEC3
#undef FUSELAB_EMU_VEC4
