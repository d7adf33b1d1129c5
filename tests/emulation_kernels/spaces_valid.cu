// Valid CUDA that reads like a call across execution spaces to a check that only looks at words: the emulation's
// check (fuselab/kernelbuild/emulate/spaces.py) must take all of it, as nvcc does (tests/test_kernels_compile_for_cuda.py
// builds this file with nvcc). One namespace per pattern.
#include <algorithm>
#include <atomic>
#include <vector>

#define SPACES_HD __host__ __device__
#define SPACES_DEVICE_INLINE __device__ __forceinline__
#define SPACES_KERNEL __global__
#define SPACES_LOOP(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

namespace macro_spaces {  // spaces spelled by macros
SPACES_HD inline float square(float x) { return x * x; }
SPACES_DEVICE_INLINE float warp_sum(float v) { return v + __shfl_down_sync(0xffffffffu, v, 1); }
SPACES_KERNEL void k(float* a) { a[threadIdx.x] = warp_sum(square(a[threadIdx.x])); }
}  // namespace macro_spaces

namespace loop_macro {  // a grid-stride loop macro's block is the kernel's code
__device__ float relu(float x) { return x > 0.f ? x : 0.f; }
__global__ void k(const float* in, float* out, int* hits, int n) {
  SPACES_LOOP(i, n) {
    out[i] = relu(in[i]);
    atomicAdd(hits, 1);
  }
}
}  // namespace loop_macro

namespace device_lambdas {  // a __device__ lambda in host code is device code, trailing return type or not
template <typename F>
__global__ void each(float* a, F f) { a[threadIdx.x] = f(a[threadIdx.x]); }
__device__ float square(float x) { return x * x; }
void run(float* d, cudaStream_t s) {
  each<<<1, 32, 0, s>>>(d, [] __device__ (float x) -> float { return square(x) + threadIdx.x; });
  each<<<1, 32, 0, s>>>(d, [] __host__ __device__ (float x) { return x; });
}
}  // namespace device_lambdas

namespace unevaluated {  // sizeof and decltype name a function without calling it
double host_only(double x) { return x; }
__device__ float device_only(float x) { return x; }
__global__ void k(float* a) {
  using T = decltype(host_only(1.0));
  a[threadIdx.x] = (float)sizeof(T);
}
size_t bytes() { return sizeof(device_only(1.f)); }
}  // namespace unevaluated

namespace shadows {  // a local name, a parameter or a declaration the same as a host function of the file
float scale(float x) { return 2 * x; }
float op(float x) { return x; }
float total(const float* x, int n) { return n ? x[0] : 0.f; }
template <typename F>
__global__ void apply(float* a, F op) { a[threadIdx.x] = op(a[threadIdx.x]); }
__global__ void k(float* a) {
  auto scale = [](float x) { return x * 3.f; };
  float total(0.f);
  a[threadIdx.x] = scale(a[threadIdx.x]) + total;
}
}  // namespace shadows

namespace standard_names {  // names the C++ library has too
using namespace std;
__device__ void swap(float& a, float& b) { float t = a; a = b; b = t; }
__global__ void fill(float* a, float v) { a[threadIdx.x] = v; }
atomic<int> launches{0};
void host(vector<float>& a, vector<float>& b) {
  swap(a, b);
  fill(a.begin(), a.end(), 0.f);
  atomic_fetch_add(&launches, 1);
}
}  // namespace standard_names

namespace disabled {  // #if 0 is not code
float cpu_reference(float x) { return x; }
__global__ void k(float* a) {
#if 0
  a[threadIdx.x] = cpu_reference(a[threadIdx.x]);
#endif
  a[threadIdx.x] += 1.f;
}
void launch(float* a, cudaStream_t s) {
#if 0
  printf("%d\n", threadIdx.x);
#endif
  k<<<1, 32, 0, s>>>(a);
}
}  // namespace disabled

namespace declarations {  // spaces given where a function is declared, its definition elsewhere
struct V {
  float x, y;
  __host__ __device__ float length2() const;
  __device__ V scaled(float s) const { return V{x * s / length2(), y * s / length2()}; }
};
float V::length2() const { return x * x + y * y + 1.f; }
float log_value(float x) { return x; }
template <typename T>
__device__ void unused_logger(T x) { log_value(x); }  // never instantiated: nvcc checks none of it
}  // namespace declarations

void spaces_valid_launch(float* a, int n, cudaStream_t stream) {
  if (n >= 32) macro_spaces::k<<<1, 32, 0, stream>>>(a);
}
