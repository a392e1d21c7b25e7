// Row softmax on the CPU, fp32 in and out, for a contiguous (rows, cols) matrix: the same three steps as
// softmax.cu (max, sum of exp(x - max), scale), one row per task. Compiled by patch.py with load_inline, so
// the patch runs its own code on CPU tensors too, instead of falling back to torch.softmax.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

torch::Tensor softmax_cpu(torch::Tensor x) {
  TORCH_CHECK(x.device().is_cpu(), "softmax_cpu: expected a CPU tensor, got ", x.device());
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_cpu: expected float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "softmax_cpu: expected a contiguous (rows, cols) matrix");
  auto y = torch::empty_like(x);
  const int64_t cols = x.size(1);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Rows are independent and each is summed in order by one thread, so results do not depend on thread count.
  at::parallel_for(0, x.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * cols;
      float* yr = yp + r * cols;
      float m = -std::numeric_limits<float>::infinity();
      // fmax skips NaN, but a NaN element still makes the sum NaN, so its whole row is NaN, as in torch.softmax.
      for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
      float s = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        yr[c] = std::exp(xr[c] - m);
        s += yr[c];
      }
      const float inv = 1.0f / s;
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
  });
  return y;
}
