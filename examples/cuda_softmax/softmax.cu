// Row softmax on CUDA, fp32 in and out: one thread block per row of a contiguous (rows, cols) matrix.
//
// Three passes over the row, all reading global memory (rows of attention scores fit in L1/L2, so the second and
// third reads are cheap): the row maximum, the sum of exp(x - max), then the output. Subtracting the maximum keeps
// every exponent <= 0, so nothing overflows. NaN and fully -inf rows come out NaN, as they do from torch.softmax.
// Compiled by patch.py with torch.utils.cpp_extension.load_inline; softmax_cuda is the function Python calls.

#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

constexpr int kThreads = 256;  // 8 warps per row: enough loads in flight to hide latency on rows of 1024
constexpr int kWarp = 32;

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Reduce one value per thread to one value per block, returned to every thread. `scratch` holds one value per warp.
// The order of additions is fixed (lanes, then warps), so the result is the same on every run: e2eprof reruns
// each call on copies of its inputs and requires bit-identical outputs.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const float identity = kMax ? -INFINITY : 0.0f;
    v = lane < kThreads / kWarp ? scratch[lane] : identity;
    v = kMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

__global__ void __launch_bounds__(kThreads) softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                                int64_t cols) {
  __shared__ float scratch[kThreads / kWarp];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * cols;  // int64: rows * cols may exceed 2^31
  float* yr = y + static_cast<int64_t>(blockIdx.x) * cols;

  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = fmaxf(m, xr[c]);
  m = block_reduce<true>(m, scratch);

  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += expf(xr[c] - m);  // expf, not __expf: fp32 accuracy
  s = block_reduce<false>(s, scratch);

  const float inv = 1.0f / s;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) yr[c] = expf(xr[c] - m) * inv;
}

}  // namespace

torch::Tensor softmax_cuda(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "softmax_cuda: expected a CUDA tensor, got ", x.device());
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_cuda: expected float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "softmax_cuda: expected a contiguous (rows, cols) matrix");
  TORCH_CHECK(x.size(0) <= std::numeric_limits<int32_t>::max(), "softmax_cuda: too many rows for one grid");
  const c10::cuda::CUDAGuard guard(x.device());
  auto y = torch::empty_like(x);
  if (x.size(0) == 0) return y;  // a grid of zero blocks is a launch error
  softmax_rows_kernel<<<static_cast<unsigned int>(x.size(0)), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
