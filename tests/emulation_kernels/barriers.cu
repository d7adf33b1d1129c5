// Kernels that wait at barriers or trade values across a warp: they run on fibers.
#include <cuda_runtime.h>
#include <cassert>

#define TILE 16

// Shared-memory tiled GEMM: C[M,N] = A[M,K] B[K,N], sizes need not be multiples of TILE.
template <bool SYNC_AFTER_LOAD>
__global__ void gemm_kernel(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[TILE][TILE], Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
    int ka = t * TILE + threadIdx.x, kb = t * TILE + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
    Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? B[kb * N + col] : 0.0f;
    if (SYNC_AFTER_LOAD) __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

void gemm_launch(const float* A, const float* B, float* C, int M, int N, int K, cudaStream_t stream) {
  dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  gemm_kernel<true><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
}
void gemm_missing_barrier_launch(const float* A, const float* B, float* C, int M, int N, int K,
                                 cudaStream_t stream) {
  dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  gemm_kernel<false><<<grid, block, 0, stream>>>(A, B, C, M, N, K);
}

// Block sum: warp shuffles, then one value per warp through shared memory. A block may end in a partial
// warp; GUARD skips the lanes it lacks (reading them is undefined in CUDA).
template <bool GUARD>
__device__ float warp_sum(float v, int lanes) {
  int lane = threadIdx.x % warpSize;
  for (int offset = warpSize / 2; offset > 0; offset >>= 1) {
    float other = __shfl_down_sync(0xffffffffu, v, offset);
    if (!GUARD || lane + offset < lanes) v += other;
  }
  return v;
}
template <bool GUARD>
__global__ void block_sum_kernel(const float* x, float* partial, int n) {
  __shared__ float warp_totals[32];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  int warps = (blockDim.x + warpSize - 1) / warpSize;
  int lanes = min(warpSize, (int)blockDim.x - warp * warpSize);
  float v = i < n ? x[i] : 0.0f;
  v = warp_sum<GUARD>(v, lanes);
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? warp_totals[lane] : 0.0f;
    v = warp_sum<GUARD>(v, min(warpSize, (int)blockDim.x));
    if (lane == 0) partial[blockIdx.x] = v;
  }
}
void block_sum_launch(const float* x, float* partial, int n, int block, cudaStream_t stream) {
  block_sum_kernel<true><<<(n + block - 1) / block, block, 0, stream>>>(x, partial, n);
}
void block_sum_unguarded_launch(const float* x, float* partial, int n, int block, cudaStream_t stream) {
  block_sum_kernel<false><<<(n + block - 1) / block, block, 0, stream>>>(x, partial, n);
}

// Tree reduction in dynamic shared memory, with and without the barrier inside the loop.
template <bool SYNC>
__global__ void tree_sum_kernel(const float* x, float* partial, int n) {
  extern __shared__ float buf[];
  int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  buf[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (t < stride) buf[t] += buf[t + stride];
    if (SYNC) __syncthreads();
  }
  if (t == 0) partial[blockIdx.x] = buf[0];
}
void tree_sum_launch(const float* x, float* partial, int n, int block, cudaStream_t stream) {
  tree_sum_kernel<true><<<(n + block - 1) / block, block, block * sizeof(float), stream>>>(x, partial, n);
}
void tree_sum_missing_barrier_launch(const float* x, float* partial, int n, int block, cudaStream_t stream) {
  tree_sum_kernel<false><<<(n + block - 1) / block, block, block * sizeof(float), stream>>>(x, partial, n);
}

// Shared memory is garbage at each block's start: never the leftovers of another block.
__global__ void shared_garbage_kernel(float* out, int* raw) {
  __shared__ float s[64];
  __shared__ int si[64];
  if (blockIdx.x == 0) { s[threadIdx.x] = 1.0f; si[threadIdx.x] = 1; }
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
  raw[blockIdx.x * 64 + threadIdx.x] = si[threadIdx.x];
}
__global__ void dynamic_garbage_kernel(float* out) {
  extern __shared__ __align__(16) float dyn[];
  if (blockIdx.x == 0) dyn[threadIdx.x] = 1.0f;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = dyn[threadIdx.x];
}
void shared_garbage_launch(float* out, int* raw, float* dyn_out, int blocks, cudaStream_t stream) {
  shared_garbage_kernel<<<blocks, 64, 0, stream>>>(out, raw);
  dynamic_garbage_kernel<<<blocks, 64, 64 * sizeof(float), stream>>>(dyn_out);
}

// Every warp operation, on a block that ends in a partial warp, with a sub-warp width.
__global__ void warp_ops_kernel(const float* x, float* down, float* up, float* xr, float* idx, float* down16,
                                unsigned* ballot, int* counts) {
  int t = threadIdx.x;
  float v = x[t];
  down[t] = __shfl_down_sync(0xffffffffu, v, 3);
  up[t] = __shfl_up_sync(0xffffffffu, v, 2);
  xr[t] = __shfl_xor_sync(0xffffffffu, v, 5);
  idx[t] = __shfl_sync(0xffffffffu, v, 7);
  down16[t] = __shfl_down_sync(0xffffffffu, v, 4, 16);
  ballot[t] = __ballot_sync(0xffffffffu, v > 0.0f);
  __syncwarp();
  int any = __any_sync(0xffffffffu, v > 2.0f), all = __all_sync(0xffffffffu, v > -100.0f);
  int c = __syncthreads_count(v > 0.0f), a = __syncthreads_and(v > 0.0f), o = __syncthreads_or(v > 0.0f);
  counts[4 * t + 0] = any * 10 + all;
  counts[4 * t + 1] = c;
  counts[4 * t + 2] = a;
  counts[4 * t + 3] = o;
}
void warp_ops_launch(const float* x, float* down, float* up, float* xr, float* idx, float* down16, int* ballot,
                     int* counts, int threads, cudaStream_t stream) {
  warp_ops_kernel<<<1, threads, 0, stream>>>(x, down, up, xr, idx, down16, reinterpret_cast<unsigned*>(ballot),
                                             counts);
}

// Threads waiting at different barriers: a deadlock the emulation reports instead of hanging.
__global__ void deadlock_kernel(float* out) {
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
  out[threadIdx.x] = 1.0f;
}
void deadlock_launch(float* out, cudaStream_t stream) { deadlock_kernel<<<1, 32, 0, stream>>>(out); }

// A failed device assert stops the launch with cudaErrorAssert, not the Python process.
__global__ void assert_kernel(const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) assert(x[i] >= 0.0f);
}
void assert_launch(const float* x, int n, cudaStream_t stream) { assert_kernel<<<(n + 31) / 32, 32, 0, stream>>>(x, n); }
