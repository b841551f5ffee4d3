// The float64 backward reference is the gradient of the float64 forward: checked against central
// differences on tiny problems (GQA, every mask and windows, fully masked rows), and the naive 16-bit backward
// stays close to it.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "check/reference.hpp"
#include "support/attention_reference.hpp"
#include "support/backward_reference.hpp"

using flashgen::AttentionShape;
using flashgen::HostInput;
using flashgen::StridedView;

namespace {

// n standard normals drawn in order, in float64 (unrounded).
std::vector<double> normals(flashgen::test::Rng& rng, int64_t n) {
  std::vector<double> x(static_cast<size_t>(n));
  for (double& e : x) e = rng.normal();
  return x;
}

}  // namespace

TEST_CASE("backward reference matches central differences of the forward", "[reference][backward]") {
  // Every mask, and windows (their sides unread under the other masks): with seqlen_q > seqlen_k the diagonal is
  // j = i - 2, so (0, 1) shows row 0 no key; (2, 0) is causal-shaped, (1, 2) two-sided.
  using flashgen::ReferenceWindow;
  const std::pair<flashgen::Mask, ReferenceWindow> masks[] = {
      {flashgen::Mask::kNone, {}},
      {flashgen::Mask::kCausal, {}},
      {flashgen::Mask::kCausalTopLeft, {}},
      {flashgen::Mask::kSlidingWindow, {0, 1}},
      {flashgen::Mask::kSlidingWindow, {2, 0}},
      {flashgen::Mask::kSlidingWindow, {1, 2}}};
  for (const auto& [mask, window] : masks) {
    AttentionShape s;
    s.batch = 2, s.seqlen_q = 6, s.seqlen_k = 4, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 8;
    flashgen::test::Rng rng(31 + static_cast<int>(mask) + 5 * static_cast<int>(window.left));
    const StridedView qv = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    const StridedView kv = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    std::vector<double> q = normals(rng, qv.elements()), k = normals(rng, kv.elements());
    std::vector<double> v = normals(rng, kv.elements());
    const std::vector<double> dout = normals(rng, qv.elements());
    const double scale = 0.4;
    const flashgen::AttentionGradients g = flashgen::attention_backward_reference_f64(
        s, HostInput::float64(q.data(), qv), HostInput::float64(k.data(), kv), HostInput::float64(v.data(), kv),
        HostInput::float64(dout.data(), qv), scale, mask, {0.0, window});
    auto loss = [&]() {
      const flashgen::AttentionResult r =
          flashgen::attention_reference_f64(s, HostInput::float64(q.data(), qv), HostInput::float64(k.data(), kv),
                                            HostInput::float64(v.data(), kv), scale, mask, {0.0, window});
      double sum = 0;
      for (size_t i = 0; i < r.out.size(); ++i) sum += dout[i] * r.out[i];
      return sum;
    };
    const double h = 1e-6;
    auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + h;
        const double up = loss();
        x[i] = saved - h;
        const double down = loss();
        x[i] = saved;
        worst = std::max(worst, std::fabs((up - down) / (2 * h) - grad[i]));
      }
      INFO(name << " mask " << flashgen::test::mask_label(mask) << " window (" << window.left << ", " << window.right
                << "): max |numeric - analytic| = " << worst);
      CHECK(worst < 1e-6);
    };
    check(q, g.dq, "dq");
    check(k, g.dk, "dk");
    check(v, g.dv, "dv");
    // Bottom-right causal with seqlen_q > seqlen_k: query rows 0 and 1 see no key, so their dq is 0; so does row 0
    // under the window (0, 1).
    if (mask == flashgen::Mask::kCausal || (mask == flashgen::Mask::kSlidingWindow && window.left == 0)) {
      for (int64_t d = 0; d < s.head_dim; ++d) CHECK(g.dq[static_cast<size_t>(qv.offset(0, 0, 0, d))] == 0.0);
    }
    if (mask == flashgen::Mask::kSlidingWindow) continue;  // the naive backward below takes no window

    // The naive fp16 backward lands within a few ulps of the gradients' magnitude.
    std::vector<double> q16 = q, k16 = k, v16 = v, do16 = dout;
    for (auto* x : {&q16, &k16, &v16, &do16})
      for (double& e : *x) e = flashgen::round_to_dtype(static_cast<float>(e), flashgen::DType::kFloat16);
    const HostInput q16in = HostInput::float64(q16.data(), qv), k16in = HostInput::float64(k16.data(), kv);
    const HostInput v16in = HostInput::float64(v16.data(), kv), do16in = HostInput::float64(do16.data(), qv);
    const flashgen::AttentionGradients exact =
        flashgen::attention_backward_reference_f64(s, q16in, k16in, v16in, do16in, scale, mask);
    const flashgen::AttentionGradients naive =
        flashgen::test::attention_backward_naive(s, q16in, k16in, v16in, do16in, scale, mask, FLASHGEN_FLOAT16);
    double worst = 0;
    for (size_t i = 0; i < exact.dq.size(); ++i) worst = std::max(worst, std::fabs(exact.dq[i] - naive.dq[i]));
    for (size_t i = 0; i < exact.dk.size(); ++i) worst = std::max(worst, std::fabs(exact.dk[i] - naive.dk[i]));
    CHECK(worst > 0);
    CHECK(worst < 2e-2);
  }
}

TEST_CASE("the references take a value head dim of its own, as MLA's", "[reference][backward]") {
  // q and k of d = 24, v of d_v = 16: the same as v padded with zero columns to 24, whose output's and dv's first 16
  // columns are this call's, its last 8 zero, whatever dO holds there. GQA, a causal mask that hides rows 0 and 1,
  // a soft cap and sinks.
  AttentionShape s;
  s.batch = 2, s.seqlen_q = 7, s.seqlen_k = 5, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 24;
  const int64_t dv = 16;
  flashgen::test::Rng rng(57);
  const StridedView qv = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  const StridedView kv = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
  const StridedView vv = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, dv);
  const StridedView ov = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, dv);
  const std::vector<double> q = normals(rng, qv.elements()), k = normals(rng, kv.elements());
  const std::vector<double> v = normals(rng, vv.elements());
  const std::vector<double> dout = normals(rng, ov.elements());
  std::vector<double> v_pad(static_cast<size_t>(kv.elements()), 0.0), dout_pad = normals(rng, qv.elements());
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seqlen_k; ++j)
      for (int64_t h = 0; h < s.heads_kv; ++h)
        for (int64_t d = 0; d < dv; ++d) {
          v_pad[size_t(kv.offset(b, j, h, d))] = v[size_t(vv.offset(b, j, h, d))];
        }
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.seqlen_q; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t d = 0; d < dv; ++d) {
          dout_pad[size_t(qv.offset(b, i, h, d))] = dout[size_t(ov.offset(b, i, h, d))];
        }
  flashgen::ReferenceVariant variant(3.0);
  variant.sinks = {0.5f, -1.f, 2.f, 0.f};
  const double scale = 0.3;
  const HostInput hq = HostInput::float64(q.data(), qv), hk = HostInput::float64(k.data(), kv);
  const flashgen::Mask mask = flashgen::Mask::kCausal;

  const flashgen::AttentionResult r =
      flashgen::attention_reference_f64(s, hq, hk, HostInput::float64(v.data(), vv), scale, mask, variant);
  const flashgen::AttentionResult r_pad =
      flashgen::attention_reference_f64(s, hq, hk, HostInput::float64(v_pad.data(), kv), scale, mask, variant);
  REQUIRE(r.out.size() == size_t(ov.elements()));
  CHECK(r.lse == r_pad.lse);
  double out_gap = 0, pad_out = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.seqlen_q; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t d = 0; d < s.head_dim; ++d) {
          const double padded = r_pad.out[size_t(qv.offset(b, i, h, d))];
          if (d < dv) out_gap = std::max(out_gap, std::fabs(padded - r.out[size_t(ov.offset(b, i, h, d))]));
          else pad_out = std::max(pad_out, std::fabs(padded));
        }
  CHECK(out_gap <= 1e-15);
  CHECK(pad_out == 0.0);

  const flashgen::AttentionGradients g = flashgen::attention_backward_reference_f64(
      s, hq, hk, HostInput::float64(v.data(), vv), HostInput::float64(dout.data(), ov), scale, mask, variant);
  const flashgen::AttentionGradients g_pad = flashgen::attention_backward_reference_f64(
      s, hq, hk, HostInput::float64(v_pad.data(), kv), HostInput::float64(dout_pad.data(), qv), scale, mask, variant);
  REQUIRE(g.dv.size() == size_t(vv.elements()));
  auto gap = [](const std::vector<double>& a, const std::vector<double>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return worst;
  };
  CHECK(gap(g.dq, g_pad.dq) <= 1e-14);
  CHECK(gap(g.dk, g_pad.dk) <= 1e-14);
  CHECK(gap(g.dsinks, g_pad.dsinks) <= 1e-14);
  double dv_gap = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seqlen_k; ++j)
      for (int64_t h = 0; h < s.heads_kv; ++h)
        for (int64_t d = 0; d < dv; ++d) {
          const double got = g.dv[size_t(vv.offset(b, j, h, d))], padded = g_pad.dv[size_t(kv.offset(b, j, h, d))];
          dv_gap = std::max(dv_gap, std::fabs(got - padded));
        }
  CHECK(dv_gap <= 1e-14);

  // MLA's values are the keys' first d_v columns, read in place: a view of k with k's strides gives what a
  // contiguous copy of those columns gives.
  StridedView latent = kv;
  latent.shape[3] = dv;
  std::vector<double> k_cols(static_cast<size_t>(vv.elements()));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seqlen_k; ++j)
      for (int64_t h = 0; h < s.heads_kv; ++h)
        for (int64_t d = 0; d < dv; ++d) {
          k_cols[size_t(vv.offset(b, j, h, d))] = k[size_t(kv.offset(b, j, h, d))];
        }
  const flashgen::AttentionResult in_place =
      flashgen::attention_reference_f64(s, hq, hk, HostInput::float64(k.data(), latent), scale, mask, variant);
  const flashgen::AttentionResult copied =
      flashgen::attention_reference_f64(s, hq, hk, HostInput::float64(k_cols.data(), vv), scale, mask, variant);
  CHECK(in_place.out == copied.out);
  CHECK(in_place.lse == copied.lse);
  // A v whose other dims differ from k's is still refused.
  StridedView wrong = vv;
  wrong.shape[1] = s.seqlen_k + 1;
  CHECK_THROWS_WITH(flashgen::attention_reference_f64(s, hq, hk, HostInput::float64(v.data(), wrong), scale, mask),
                    "reference: v view does not match the problem shape");
}
