// A user-defined variant on the command line (`emit --variant FILE`, `compile --variant FILE`): its description read
// from JSON and checked as flashgen_variant_create checks it, and config names that end with its tag.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/common.hpp"
#include "problem/user_variant.hpp"
#include "runtime/device_buffer.hpp"

namespace flashgen::cli {

// The help text of --variant.
extern const char* const kVariantHelp;

// The variant --variant FILE describes ('-': stdin), its functions compiled once on their own so that their errors
// come back now, with NVRTC's messages at the functions' lines; nullptr without --variant.
std::shared_ptr<const UserVariant> variant_of(const Args& args);

// The values `flashgen tune --variant FILE` calls the functions with: each buffer's "values" (a list of numbers of
// its type) uploaded to the current context's device, each scalar's "value"; an error naming the one missing.
struct VariantValues {
  std::vector<DeviceBuffer> buffers;
  UserVariantArgs args;  // pointers into buffers
};
VariantValues variant_values_of(const Args& args, const UserVariant& user);

// The help text of tune's --variant.
extern const char* const kTuneVariantHelp;

// Compiles user (when given) into a config that came without a name (from JSON, or the built-in defaults).
void attach_variant(AnyConfig& config, std::shared_ptr<const UserVariant> user);

// The config a name gives, with user (when given) compiled in: a name ending with a variant's tag (_u and 12 hex
// digits) must come with that variant's description.
AnyConfig config_from_name(const std::string& name, std::shared_ptr<const UserVariant> user);

}  // namespace flashgen::cli
