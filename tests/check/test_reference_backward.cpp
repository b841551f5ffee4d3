// The float64 backward reference is the gradient of the float64 forward: checked against central
// differences on tiny problems (GQA, every mask and windows, fully masked rows), and the naive 16-bit backward
// stays close to it.
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
    auto normals = [&](int64_t n) {
      std::vector<double> x(static_cast<size_t>(n));
      for (double& e : x) e = rng.normal();
      return x;
    };
    const StridedView qv = StridedView::contiguous(s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    const StridedView kv = StridedView::contiguous(s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    std::vector<double> q = normals(qv.elements()), k = normals(kv.elements()), v = normals(kv.elements());
    const std::vector<double> dout = normals(qv.elements());
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
