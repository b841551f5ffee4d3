// Loader stage: KernelConfig -> CompiledKernel (memory map, then the disk cache, then NVRTC) -> CUfunction
// loaded once per CUDA context. Compiles run outside the registry mutex so different kernels build in
// parallel; the disk cache's per-key lock keeps one kernel from being compiled twice.
#include "runtime/kernel_registry.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "flashgen/error.hpp"
#include "generator/generator.hpp"
#include "runtime/cuda_driver.hpp"

namespace flashgen {
namespace {

// Cache payload: u64 little-endian length of a JSON description | the JSON | the cubin bytes.
constexpr size_t kJsonLengthBytes = 8;
constexpr int kPayloadFormat = 1;

// Length-prefixed so that moving bytes between pieces ("ab"+"c" vs "a"+"bc") changes the hash.
void append_piece(const std::string& piece, std::string* blob) {
  *blob += std::to_string(piece.size());
  *blob += ':';
  *blob += piece;
}

std::string serialize(const CompiledKernel& kernel) {
  nlohmann::json description = {
      {"format", kPayloadFormat},
      {"kernel_name", kernel.kernel_name},
      {"arch", kernel.arch},
      {"options", kernel.options},
      {"log", kernel.log},
      {"compile_ms", kernel.compile_ms},
      {"usage",
       {{"registers", kernel.usage.registers},
        {"static_smem_bytes", kernel.usage.static_smem_bytes},
        {"stack_bytes", kernel.usage.stack_bytes},
        {"spill_store_bytes", kernel.usage.spill_store_bytes},
        {"spill_load_bytes", kernel.usage.spill_load_bytes}}},
      {"cubin_bytes", kernel.cubin.size()},
  };
  std::string json = description.dump();
  std::string payload(kJsonLengthBytes, '\0');
  for (size_t i = 0; i < kJsonLengthBytes; ++i)
    payload[i] = static_cast<char>((static_cast<uint64_t>(json.size()) >> (8 * i)) & 0xff);
  payload += json;
  payload += kernel.cubin;
  return payload;
}

// The kernel a payload describes, or nullopt when it is not a payload of this format for this kernel.
std::optional<CompiledKernel> deserialize(const std::string& payload, const std::string& kernel_name,
                                          int arch) {
  if (payload.size() < kJsonLengthBytes) return std::nullopt;
  uint64_t json_size = 0;
  for (size_t i = 0; i < kJsonLengthBytes; ++i)
    json_size |= static_cast<uint64_t>(static_cast<unsigned char>(payload[i])) << (8 * i);
  if (json_size > payload.size() - kJsonLengthBytes) return std::nullopt;
  try {
    nlohmann::json description = nlohmann::json::parse(payload.substr(kJsonLengthBytes, json_size));
    CompiledKernel kernel;
    kernel.cubin = payload.substr(kJsonLengthBytes + json_size);
    if (description.at("format").get<int>() != kPayloadFormat ||
        description.at("cubin_bytes").get<size_t>() != kernel.cubin.size())
      return std::nullopt;
    kernel.kernel_name = description.at("kernel_name").get<std::string>();
    kernel.arch = description.at("arch").get<int>();
    if (kernel.kernel_name != kernel_name || kernel.arch != arch) return std::nullopt;
    kernel.options = description.at("options").get<std::vector<std::string>>();
    kernel.log = description.at("log").get<std::string>();
    const nlohmann::json& usage = description.at("usage");
    kernel.usage.registers = usage.at("registers").get<int>();
    kernel.usage.static_smem_bytes = usage.at("static_smem_bytes").get<int>();
    kernel.usage.stack_bytes = usage.at("stack_bytes").get<int>();
    kernel.usage.spill_store_bytes = usage.at("spill_store_bytes").get<int>();
    kernel.usage.spill_load_bytes = usage.at("spill_load_bytes").get<int>();
    kernel.usage.ptxas_notes = parse_ptxas_log(kernel.log).ptxas_notes;  // kept in the log, not the payload
    return kernel;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// boost::hash_combine's mixing step, widened to 64 bits.
void hash_combine(size_t value, size_t* seed) {
  *seed ^= value + 0x9e3779b97f4a7c15ULL + (*seed << 6) + (*seed >> 2);
}

// Unloads a module unless release() says the registry now owns it.
class ModuleGuard {
 public:
  explicit ModuleGuard(CUmodule module) : module_(module) {}
  ~ModuleGuard() {
    if (module_ != nullptr) driver().cuModuleUnload(module_);
  }
  ModuleGuard(const ModuleGuard&) = delete;
  ModuleGuard& operator=(const ModuleGuard&) = delete;
  void release() { module_ = nullptr; }

 private:
  CUmodule module_;
};

}  // namespace

void check_user_functions_compile(const UserVariant& user) {
  static std::mutex mutex;
  static std::set<std::string> compiled;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (compiled.count(user.tag) != 0) return;
  }
  compile_nvrtc(generate_user_probe(user), 80);
  const std::lock_guard<std::mutex> lock(mutex);
  compiled.insert(user.tag);
}

std::string kernel_cache_key(const GeneratedSource& source, int arch) {
  std::string blob;
  append_piece(source.translation_unit, &blob);
  for (const SourceFile& header : source.headers) {
    append_piece(header.name, &blob);
    append_piece(header.contents, &blob);
  }
  for (const std::string& option : nvrtc_options(arch)) append_piece(option, &blob);
  append_piece(nvrtc_version(), &blob);
  append_piece(kGeneratorVersion, &blob);
  return source.kernel_name + "-sm" + std::to_string(arch) + "-" + content_hash(blob);
}

size_t KernelRegistry::ModuleIdHash::operator()(const ModuleId& id) const {
  size_t seed = std::hash<std::string>()(id.name);
  hash_combine(static_cast<size_t>(id.arch), &seed);
  return seed;
}

size_t KernelRegistry::LoadedIdHash::operator()(const LoadedId& id) const {
  size_t seed = ModuleIdHash()(id.module);
  hash_combine(std::hash<std::string>()(id.symbol), &seed);
  hash_combine(static_cast<size_t>(id.context_id), &seed);
  return seed;
}

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry registry(KernelCache::default_dir());
  return registry;
}

KernelRegistry::KernelRegistry(std::filesystem::path cache_dir) : cache_(std::move(cache_dir)) {}

std::shared_ptr<const CompiledKernel> KernelRegistry::compiled_module(const ModuleId& id,
                                                                      const Generate& generate_source) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = compiled_.find(id);
    if (found != compiled_.end()) return found->second;
  }

  // Unlocked from here: a compile takes seconds, and the disk cache's per-key file lock already makes a
  // second thread asking for the same kernel wait for the first and read its result.
  const GeneratedSource source = generate_source();
  const int arch = id.arch;
  const std::string cache_key = kernel_cache_key(source, arch);
  std::optional<CompiledKernel> fresh;
  bool hit = false;
  std::string payload = cache_.get_or_create(
      cache_key,
      [&] {
        fresh = compile_nvrtc(source, arch);
        return serialize(*fresh);
      },
      &hit);

  std::optional<CompiledKernel> kernel;
  if (fresh) {
    kernel = std::move(fresh);
  } else if ((kernel = deserialize(payload, source.kernel_name, arch))) {
    kernel->from_cache = true;
    kernel->compile_ms = 0;
  } else {
    // An intact entry this build cannot read (older payload format): rebuild and replace it.
    kernel = compile_nvrtc(source, arch);
    cache_.store(cache_key, serialize(*kernel));
  }

  auto shared = std::make_shared<const CompiledKernel>(std::move(*kernel));
  std::lock_guard<std::mutex> lock(mutex_);
  return compiled_.emplace(id, std::move(shared)).first->second;  // a racing thread's copy wins
}

CUfunction KernelRegistry::load(const ModuleId& id, const std::string& symbol, int smem_bytes, CUcontext ctx,
                                const Generate& generate_source) {
  // The context pointer alone is no identity: the driver may place a new context at a destroyed
  // one's address, and a reset primary context keeps its handle, while their modules are gone.
  unsigned long long context_id = 0;
  FLASHGEN_CU_CHECK(cuCtxGetId(ctx, &context_id));
  const LoadedId key{context_id, id, symbol};
  const LoadedId module_key{context_id, id, std::string()};
  CUmodule module = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = loaded_.find(key);
    if (found != loaded_.end()) return found->second;
    auto found_module = modules_.find(module_key);
    if (found_module != modules_.end()) module = found_module->second;
  }

  std::shared_ptr<const CompiledKernel> kernel = compiled_module(id, generate_source);
  if (module == nullptr) {
    FLASHGEN_CU_CHECK(cuModuleLoadData(&module, kernel->cubin.data()));
    ModuleGuard guard(module);
    std::lock_guard<std::mutex> lock(mutex_);
    auto [entry, inserted] = modules_.emplace(module_key, module);
    if (inserted) guard.release();  // modules stay loaded for the life of the context
    module = entry->second;
  }
  CUfunction function = nullptr;
  FLASHGEN_CU_CHECK(cuModuleGetFunction(&function, module, symbol.c_str()));
  // Above 48 KiB of dynamic shared memory a kernel must opt in; the traits say how much it uses.
  if (smem_bytes > 0) {
    try {
      FLASHGEN_CU_CHECK(cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes));
    } catch (const Error& e) {
      throw Error(e.status(), std::string(e.what()) + " (" + symbol + " asks for " + std::to_string(smem_bytes) +
                                  " bytes of dynamic shared memory)");
    }
  }

  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_.emplace(key, function).first->second;
}

}  // namespace flashgen
