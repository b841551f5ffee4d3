// Device-looking pointers for argument-validation tests: never dereferenced, because validation rejects
// the call first; 16-byte aligned like real allocations and distinct for each n.
#pragma once

#include <cstdint>

namespace flashgen::test {

inline void* fake_pointer(std::uintptr_t n) { return reinterpret_cast<void*>(0x100000 + n * 0x1000000); }

}  // namespace flashgen::test
