// TMA layouts: which tensors the sm90 family can describe (the rest fall back to the sm80 family).
// Encoding itself needs the driver and runs in the [gpu] forward tests.
#include <cstdint>
#include <string>

#include "catch.hpp"
#include "generator/tma_layout.hpp"

namespace {

// A contiguous [2, 300, 4, 128] fp16 tensor at a 16-byte aligned address (never dereferenced).
flashgen::TmaTensor contiguous() {
  flashgen::TmaTensor t;
  t.data = reinterpret_cast<const void*>(std::uintptr_t{0x10000});
  t.batch = 2, t.seqlen = 300, t.heads = 4, t.head_dim = 128;
  t.row_stride = 4 * 128, t.head_stride = 128, t.batch_stride = 300 * 4 * 128;
  return t;
}

std::string reason(const flashgen::TmaTensor& t, int box_rows = 128) {
  const auto why = flashgen::tma_unsupported_reason(t, box_rows);
  return why ? *why : "";
}

}  // namespace

TEST_CASE("TMA describes the layouts the sm90 family serves", "[generator][tma]") {
  CHECK(reason(contiguous()).empty());
  flashgen::TmaTensor bhsd = contiguous();  // [b, h, s, d] memory order
  bhsd.head_stride = 300 * 128, bhsd.row_stride = 128;
  CHECK(reason(bhsd).empty());
  flashgen::TmaTensor padded = contiguous();  // rows 8 elements (16 bytes) apart more than needed
  padded.row_stride += 8, padded.head_stride += 8;
  CHECK(reason(padded).empty());
  flashgen::TmaTensor one_batch = contiguous();  // an extent-1 dimension's stride is never used
  one_batch.batch = 1, one_batch.batch_stride = 0;
  CHECK(reason(one_batch).empty());
  CHECK(reason(contiguous(), 256).empty());
}

TEST_CASE("TMA refuses what it cannot describe, saying why", "[generator][tma]") {
  flashgen::TmaTensor t = contiguous();
  t.data = reinterpret_cast<const void*>(std::uintptr_t{0x10008});
  CHECK(reason(t).find("16-byte aligned") != std::string::npos);

  t = contiguous();
  t.head_dim = 96, t.head_stride = 96, t.row_stride = 4 * 96;  // boxes past head_dim are zero-filled
  CHECK_FALSE(flashgen::tma_unsupported_reason(t, 64).has_value());
  t.head_dim = 100, t.head_stride = 104, t.row_stride = 4 * 104;
  CHECK(reason(t).find("multiple of 8") != std::string::npos);

  t = contiguous();
  t.batch_stride = 0;  // batch broadcast: two batches read the same rows
  CHECK(reason(t).find("stride 0") != std::string::npos);

  t = contiguous();
  t.row_stride = 4 * 128 + 4;  // 8 bytes past a 16-byte multiple
  CHECK(reason(t).find("multiple of 16 bytes") != std::string::npos);

  t = contiguous();
  t.batch_stride = int64_t(1) << 40;  // 2^41 bytes
  CHECK(reason(t).find("below 2^40") != std::string::npos);

  CHECK(reason(contiguous(), 257).find("256 rows") != std::string::npos);
  CHECK(reason(contiguous(), 0).find("256 rows") != std::string::npos);
}
