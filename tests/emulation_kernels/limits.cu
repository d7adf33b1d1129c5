// Launches that break CUDA's limits must fail as on a GPU: the kernel does not run, an error is recorded.
#include <cuda_runtime.h>

__global__ void fill_kernel(float* out, int n) {
  extern __shared__ float scratch[];
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  scratch[0] = 0.0f;
  if (t == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && n > 0) out[0] = 42.0f;
}

void configured_launch(float* out, int n, int gx, int gy, int gz, int bx, int by, int bz, int shmem,
                       cudaStream_t stream) {
  fill_kernel<<<dim3(gx, gy, gz), dim3(bx, by, bz), shmem, stream>>>(out, n);
}

int allow_dynamic_shared(int bytes, cudaStream_t stream) {
  (void)stream;
  return (int)cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

__global__ void big_static_kernel(float* out) {
  __shared__ float big[16 * 1024];  // 64 KB: more static shared memory than CUDA allows
  big[threadIdx.x] = 1.0f;
  out[0] = big[0];
}
void big_static_launch(float* out, cudaStream_t stream) { big_static_kernel<<<1, 32, 0, stream>>>(out); }
