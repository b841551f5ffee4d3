// SASS of compiled kernels, for people inspecting what a config became: the CUDA toolkit's cuobjdump
// disassembles a cubin (no GPU needed). Where the toolkit has no cuobjdump, find_cuobjdump says so and
// disassemble_cubin fails with the places it looked.
#pragma once

#include <string>

namespace flashgen {

// cuobjdump from $CUDA_HOME/bin, then /usr/local/cuda/bin, then $PATH; empty when none has it.
std::string find_cuobjdump();

// find_cuobjdump's answer, or an Error (kUnsupported) that says where it looked and what to do instead.
std::string require_cuobjdump();

// `cuobjdump -sass` of the cubin bytes (written to a temporary file, removed afterwards). Throws Error
// (kUnsupported) when there is no cuobjdump, (kInternal) when it fails.
std::string disassemble_cubin(const std::string& cubin);

// Occurrences of an opcode in SASS text: the whole mnemonic, followed by a modifier ('.') or a space.
int sass_opcode_count(const std::string& sass, const std::string& opcode);

}  // namespace flashgen
