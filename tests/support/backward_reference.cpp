// The test side of backward numerics declared in backward_reference.hpp: the naive same-dtype backward and
// the gradient check.
#include "support/backward_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "api/from_c.hpp"

namespace flashgen::test {

AttentionGradients attention_backward_naive(const AttentionShape& shape, const HostInput& q, const HostInput& k,
                                            const HostInput& v, const HostInput& dout, double scale,
                                            Mask mask, flashgen_dtype dtype) {
  require_reference_inputs(shape, q, k, v);
  const int64_t d = shape.head_dim;
  const int64_t dv_dim = v.view.shape[3];  // the values' (and dout's) head dim
  const float scale_f = static_cast<float>(scale);
  std::vector<float> dq(static_cast<size_t>(shape.batch * shape.seqlen_q * shape.heads_q * d), 0.0f);
  std::vector<float> dk(static_cast<size_t>(shape.batch * shape.seqlen_k * shape.heads_kv * d), 0.0f);
  std::vector<float> dv(static_cast<size_t>(shape.batch * shape.seqlen_k * shape.heads_kv * dv_dim), 0.0f);
  const StridedView q_out = StridedView::contiguous(shape.batch, shape.seqlen_q, shape.heads_q, d);
  const StridedView kv_out = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, d);
  const StridedView v_out = StridedView::contiguous(shape.batch, shape.seqlen_k, shape.heads_kv, dv_dim);

  std::vector<double> scratch(static_cast<size_t>(std::max(d, dv_dim)));
  std::vector<float> qi(d), doi(dv_dim), out(dv_dim), p;
  for (int64_t b = 0; b < shape.batch; ++b)
    for (int64_t h = 0; h < shape.heads_q; ++h) {
      const int64_t hk = shape.kv_head(h);
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t visible = visible_key_count(mask, i, shape.seqlen_q, shape.seqlen_k);
        if (visible == 0) continue;
        const double* q64 = q.row(b, i, h, scratch.data());
        for (int64_t x = 0; x < d; ++x) qi[x] = static_cast<float>(q64[x]);
        const double* do64 = dout.row(b, i, h, scratch.data());
        for (int64_t x = 0; x < dv_dim; ++x) doi[x] = static_cast<float>(do64[x]);
        p.assign(static_cast<size_t>(visible), 0.0f);
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const double* kj = k.row(b, j, hk, scratch.data());
          float s = 0.0f;
          for (int64_t x = 0; x < d; ++x) s += qi[x] * static_cast<float>(kj[x]);
          p[j] = s * scale_f;
          row_max = std::max(row_max, p[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) sum += (p[j] = std::exp(p[j] - row_max));
        std::fill(out.begin(), out.end(), 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          p[j] /= sum;
          const double* vj = v.row(b, j, hk, scratch.data());
          const float p16 = round_to_dtype(p[j], from_c(dtype));
          for (int64_t x = 0; x < dv_dim; ++x) out[x] += p16 * static_cast<float>(vj[x]);
        }
        float dsum = 0.0f;
        for (int64_t x = 0; x < dv_dim; ++x) dsum += doi[x] * round_to_dtype(out[x], from_c(dtype));
        float* dqi = &dq[static_cast<size_t>(q_out.offset(b, i, h, 0))];
        for (int64_t j = 0; j < visible; ++j) {
          const double* vj = v.row(b, j, hk, scratch.data());
          float dp = 0.0f;
          for (int64_t x = 0; x < dv_dim; ++x) dp += doi[x] * static_cast<float>(vj[x]);
          const float p16 = round_to_dtype(p[j], from_c(dtype));
          const float ds16 = round_to_dtype(p[j] * (dp - dsum), from_c(dtype));
          const double* kj = k.row(b, j, hk, scratch.data());
          float* dkj = &dk[static_cast<size_t>(kv_out.offset(b, j, hk, 0))];
          float* dvj = &dv[static_cast<size_t>(v_out.offset(b, j, hk, 0))];
          for (int64_t x = 0; x < d; ++x) {
            dqi[x] += ds16 * static_cast<float>(kj[x]);
            dkj[x] += ds16 * qi[x];
          }
          for (int64_t x = 0; x < dv_dim; ++x) dvj[x] += p16 * doi[x];
        }
      }
    }
  AttentionGradients grads;
  auto finish = [&](const std::vector<float>& acc, float factor) {
    std::vector<double> rounded(acc.size());
    for (size_t i = 0; i < acc.size(); ++i) rounded[i] = round_to_dtype(acc[i] * factor, from_c(dtype));
    return rounded;
  };
  grads.dq = finish(dq, scale_f);
  grads.dk = finish(dk, scale_f);
  grads.dv = finish(dv, 1.0f);
  return grads;
}

CheckReport check_gradient(const char* name, const std::vector<int64_t>& dims, const std::vector<double>& got,
                           const std::vector<double>& ref64, const std::vector<double>& naive, flashgen_dtype dtype) {
  return check_within_budget(name, dims, got, ref64, naive, gradient_budget_floor(from_c(dtype), max_magnitude(ref64)));
}

}  // namespace flashgen::test
