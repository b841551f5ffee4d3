// Introspection behind flashgen_explain_forward / flashgen_explain_backward: which config a call would
// run and why, its launch shape and ptxas resources, and its generated source written where a person can
// read or compile it. Used by the Python package's flashgen.torch.explain.
#pragma once

#include <cuda.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "generator/generator.hpp"
#include "dispatch/dispatch.hpp"

namespace flashgen {

// Writes source.self_contained() (what `flashgen emit` prints) to dir/<kernel_name>.cu through a temporary
// file and a rename, so a reader never sees half a file; returns the path. Throws Error(kInternal) naming
// the path and the cause when the folder cannot be created or the file written.
std::filesystem::path write_generated_source(const GeneratedSource& source, const std::filesystem::path& dir);

// <kernel cache folder>/sources: where the explain calls write generated sources.
std::filesystem::path generated_source_dir();

// What attention_forward(call, stream) would run, as flashgen.h's flashgen_explain_forward describes it.
// Compiles or loads the kernel like a first call; launches nothing.
nlohmann::json explain_forward(const ForwardCall& call, CUstream stream);

// The same for attention_backward(call, stream), with one "kernels" entry per kernel in launch order and
// "workspace_bytes".
nlohmann::json explain_backward(const BackwardCall& call, CUstream stream);

}  // namespace flashgen
