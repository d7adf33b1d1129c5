// fuselab CPU emulation: barriers and warp-level operations.
//
// A warp operation deposits the calling lane's value, waits until every live lane named in the mask has
// arrived, then reads. Lanes that exited, lanes outside the mask and lanes past a partial last warp have
// no value: reading one gives garbage, as on the GPU it gives an undefined result.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fuselab_emu_launch.h"

namespace fuselab_emu {

template <class T>
static inline std::uint64_t to_bits(const T& v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "warp shuffles move values of at most 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <class T>
static inline T from_bits(std::uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

template <class T>
static inline T shuffle_from(unsigned mask, const T& var, int (*pick)(int lane, int arg, int width), int arg,
                             int width, const char* what) {
  int lane = 0;
  unsigned participants = 0;
  const std::uint64_t* row = warp_exchange(mask, to_bits(var), &participants, &lane, what);
  if (width <= 0 || width > 32 || (width & (width - 1))) width = 32;
  const int src = pick(lane, arg, width);
  if (!(participants & (1u << src))) return from_bits<T>(kGarbageBits);
  return from_bits<T>(row[src]);
}

static inline int pick_index(int lane, int src, int width) { return (lane & ~(width - 1)) + (src & (width - 1)); }
static inline int pick_down(int lane, int delta, int width) {
  return ((lane & (width - 1)) + delta < width) ? lane + delta : lane;
}
static inline int pick_up(int lane, int delta, int width) {
  return ((lane & (width - 1)) >= delta) ? lane - delta : lane;
}
static inline int pick_xor(int lane, int lane_mask, int width) {
  const int src = (lane ^ lane_mask) & 31;
  return ((src & ~(width - 1)) > (lane & ~(width - 1))) ? lane : src;
}

// Reductions over the lanes that took part and are named in mask.
template <class Op>
static inline std::uint64_t warp_reduce(unsigned mask, std::uint64_t bits, std::uint64_t init, Op op,
                                        const char* what) {
  int lane_of_caller = 0;
  unsigned participants = 0;
  const std::uint64_t* row = warp_exchange(mask, bits, &participants, &lane_of_caller, what);
  std::uint64_t acc = init;
  for (int lane = 0; lane < 32; ++lane)
    if (participants & mask & (1u << lane)) acc = op(acc, row[lane], lane);
  return acc;
}

}  // namespace fuselab_emu

// The caller's line (g++ gives it to a default argument, after the build's #line): a barrier that threads reach at
// different lines, or that some threads never reach, is named by it in the launch's barrier note.
static inline void __syncthreads(int line = __builtin_LINE()) {
  fuselab_emu::block_barrier(0, "__syncthreads()", line);
}

static inline int __syncthreads_count(int predicate) {
  return (int)fuselab_emu::barrier_count(fuselab_emu::block_barrier(predicate, "__syncthreads_count()", 0));
}

static inline int __syncthreads_and(int predicate) {
  const unsigned phase = fuselab_emu::block_barrier(predicate, "__syncthreads_and()", 0);
  return fuselab_emu::barrier_count(phase) == fuselab_emu::barrier_participants(phase);
}

static inline int __syncthreads_or(int predicate) {
  return fuselab_emu::barrier_count(fuselab_emu::block_barrier(predicate, "__syncthreads_or()", 0)) > 0;
}

static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  unsigned participants;
  int lane;
  fuselab_emu::warp_exchange(mask, 0, &participants, &lane, "__syncwarp()");
}

static inline unsigned __activemask() { return fuselab_emu::active_mask("__activemask()"); }

template <class T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return fuselab_emu::shuffle_from(mask, var, &fuselab_emu::pick_index, src_lane, width, "__shfl_sync()");
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return fuselab_emu::shuffle_from(mask, var, &fuselab_emu::pick_down, (int)delta, width, "__shfl_down_sync()");
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return fuselab_emu::shuffle_from(mask, var, &fuselab_emu::pick_up, (int)delta, width, "__shfl_up_sync()");
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return fuselab_emu::shuffle_from(mask, var, &fuselab_emu::pick_xor, lane_mask, width, "__shfl_xor_sync()");
}

static inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, predicate != 0, 0,
      [](std::uint64_t acc, std::uint64_t v, int lane) { return v ? acc | (1ull << lane) : acc; },
      "__ballot_sync()");
}
static inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
static inline int __all_sync(unsigned mask, int predicate) {
  return (int)fuselab_emu::warp_reduce(
      mask, predicate != 0, 1, [](std::uint64_t acc, std::uint64_t v, int) { return acc && v; },
      "__all_sync()");
}
static inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, value, 0, [](std::uint64_t acc, std::uint64_t v, int) { return (std::uint64_t)(unsigned)(acc + v); },
      "__reduce_add_sync()");
}
static inline int __reduce_add_sync(unsigned mask, int value) {
  return (int)__reduce_add_sync(mask, (unsigned)value);
}
static inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, value, 0xffffffffu, [](std::uint64_t acc, std::uint64_t v, int) { return v < acc ? v : acc; },
      "__reduce_min_sync()");
}
static inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, value, 0, [](std::uint64_t acc, std::uint64_t v, int) { return v > acc ? v : acc; },
      "__reduce_max_sync()");
}
static inline int __reduce_min_sync(unsigned mask, int value) {
  return (int)(fuselab_emu::warp_reduce(
                   mask, (std::uint64_t)((std::int64_t)value + 0x80000000ll), 0xffffffffull,
                   [](std::uint64_t acc, std::uint64_t v, int) { return v < acc ? v : acc; },
                   "__reduce_min_sync()") -
               0x80000000ll);
}
static inline int __reduce_max_sync(unsigned mask, int value) {
  return (int)(fuselab_emu::warp_reduce(
                   mask, (std::uint64_t)((std::int64_t)value + 0x80000000ll), 0,
                   [](std::uint64_t acc, std::uint64_t v, int) { return v > acc ? v : acc; },
                   "__reduce_max_sync()") -
               0x80000000ll);
}
static inline unsigned __reduce_and_sync(unsigned mask, unsigned value) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, value, 0xffffffffu, [](std::uint64_t acc, std::uint64_t v, int) { return acc & v; },
      "__reduce_and_sync()");
}
static inline unsigned __reduce_or_sync(unsigned mask, unsigned value) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, value, 0, [](std::uint64_t acc, std::uint64_t v, int) { return acc | v; }, "__reduce_or_sync()");
}
static inline unsigned __reduce_xor_sync(unsigned mask, unsigned value) {
  return (unsigned)fuselab_emu::warp_reduce(
      mask, value, 0, [](std::uint64_t acc, std::uint64_t v, int) { return acc ^ v; }, "__reduce_xor_sync()");
}

[[noreturn]] static inline void __trap() { fuselab_emu::trap(); }
[[noreturn]] static inline void __brkpt() { __trap(); }

// The translator turns `assert(` into this: a failed assert stops the launch with cudaErrorAssert
// instead of aborting the Python process.
#define FUSELAB_EMU_ASSERT(...) \
  ((__VA_ARGS__) ? (void)0 : ::fuselab_emu::assert_fail(#__VA_ARGS__, __FILE__, __LINE__))
