// A small command-line parser for the flashgen tool: each subcommand declares its flags, valued options
// and positionals once, and gets its usage text and strict typed access from that one declaration.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flashgen::cli {

// A mistake on the command line: main prints the message and the usage reminder it carries, and exits 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& message, std::string usage)
      : std::runtime_error(message), usage_(std::move(usage)) {}
  const std::string& usage() const { return usage_; }

 private:
  std::string usage_;
};

struct OptionSpec {
  std::string name;        // long name without dashes, e.g. "seqlen-q"
  char short_name = 0;     // 'o' for -o; 0 when there is none
  std::string value_name;  // e.g. "N"; empty for a flag that takes no value
  std::string help;
  bool repeatable = false;
  bool internal = false;   // parsed, but left out of the help (what one flashgen process passes another)
};

// The parsed command line of one subcommand: option values by long name, then the positionals.
class Args {
 public:
  bool has(const std::string& name) const { return values_.count(name) != 0; }

  // The command's usage reminder (Command::reminder), for UsageErrors raised while reading values.
  const std::string& usage() const { return usage_; }

  // Every value given for a repeatable option, in order (empty when absent).
  std::vector<std::string> values(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }

  std::string string_or(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }

  // The option as an integer in [lo, hi]; a malformed or out-of-range value is a UsageError.
  long long int_or(const std::string& name, long long fallback, long long lo = std::numeric_limits<long long>::min(),
                   long long hi = std::numeric_limits<long long>::max()) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    return parse_int(name, it->second.back(), lo, hi);
  }

  double double_or(const std::string& name, double fallback) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    const std::string& text = it->second.back();
    errno = 0;
    char* end = nullptr;
    double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
      throw UsageError("--" + name + " expects a number, got '" + text + "'", usage_);
    return value;
  }

  // One of the allowed words, e.g. --dtype fp16|bf16.
  std::string choice_or(const std::string& name, const std::string& fallback,
                        const std::vector<std::string>& allowed) const {
    std::string value = string_or(name, fallback);
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      std::string list;
      for (const std::string& word : allowed) list += (list.empty() ? "" : "|") + word;
      throw UsageError("--" + name + " expects one of " + list + ", got '" + value + "'", usage_);
    }
    return value;
  }

  long long parse_int(const std::string& name, const std::string& text, long long lo, long long hi) const {
    errno = 0;
    char* end = nullptr;
    long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || end != text.c_str() + text.size())
      throw UsageError("--" + name + " expects an integer, got '" + text + "'", usage_);
    if (errno == ERANGE || value < lo || value > hi)
      throw UsageError("--" + name + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                           text,
                       usage_);
    return value;
  }

  std::vector<std::string> positionals;

 private:
  friend class Command;
  std::map<std::string, std::vector<std::string>> values_;
  std::string usage_;
};

// One subcommand: its options, its usage text and the parser for its arguments. -h/--help is implicit.
class Command {
 public:
  // synopsis follows "flashgen <name> ", e.g. "[options] <config-name>..."; max_positionals < 0: any number.
  Command(std::string name, std::string summary, std::string synopsis, int max_positionals = 0,
          std::string positional_help = "")
      : name_(std::move(name)),
        summary_(std::move(summary)),
        synopsis_(std::move(synopsis)),
        positional_help_(std::move(positional_help)),
        max_positionals_(max_positionals) {}

  Command& flag(const std::string& name, const std::string& help, char short_name = 0) {
    options_.push_back({name, short_name, "", help, false});
    return *this;
  }

  Command& option(const std::string& name, const std::string& value_name, const std::string& help,
                  bool repeatable = false, char short_name = 0) {
    options_.push_back({name, short_name, value_name, help, repeatable});
    return *this;
  }

  // The last option added is internal: parsed as any other, left out of --help.
  Command& internal() {
    options_.back().internal = true;
    return *this;
  }

  const std::string& name() const { return name_; }
  std::string synopsis_line() const { return "usage: flashgen " + name_ + (synopsis_.empty() ? "" : " " + synopsis_); }
  const std::string& summary() const { return summary_; }

  // What a usage error prints after its message: the synopsis and where the options are, rather than every option,
  // which would scroll the message itself away.
  std::string reminder() const { return synopsis_line() + "\n(flashgen " + name_ + " --help lists every option)\n"; }

  std::string usage() const {
    std::string text = synopsis_line() + "\n\n" + summary_ + "\n";
    if (!positional_help_.empty()) text += "\n" + positional_help_ + "\n";
    std::vector<std::pair<std::string, std::string>> rows;
    for (const OptionSpec& spec : options_) {
      if (spec.internal) continue;
      std::string left = spec.short_name ? std::string("-") + spec.short_name + ", " : "";
      left += "--" + spec.name + (spec.value_name.empty() ? "" : " " + spec.value_name);
      rows.emplace_back(left, spec.help + (spec.repeatable ? " (repeatable)" : ""));
    }
    rows.emplace_back("-h, --help", "show this help");
    size_t width = 0;
    for (const auto& row : rows) width = std::max(width, row.first.size());
    text += "\noptions:\n";
    for (const auto& row : rows) text += "  " + row.first + std::string(width - row.first.size() + 2, ' ') + row.second + "\n";
    return text;
  }

  // Parses argv (the words after the subcommand). Accepts --name value, --name=value, -o value, -ovalue,
  // "--" to end options, and "-" as a positional. Returns nullopt when help was asked for.
  std::optional<Args> parse(const std::vector<std::string>& argv) const {
    Args args;
    args.usage_ = reminder();
    bool options_done = false;
    for (size_t i = 0; i < argv.size(); ++i) {
      const std::string& word = argv[i];
      if (options_done || word == "-" || word.empty() || word[0] != '-') {
        args.positionals.push_back(word);
        continue;
      }
      if (word == "--") {
        options_done = true;
        continue;
      }
      if (word == "-h" || word == "--help") return std::nullopt;
      std::string name = word;
      std::optional<std::string> inline_value;
      const OptionSpec* spec = nullptr;
      if (word.rfind("--", 0) == 0) {
        name = word.substr(2);
        size_t eq = name.find('=');
        if (eq != std::string::npos) {
          inline_value = name.substr(eq + 1);
          name = name.substr(0, eq);
        }
        for (const OptionSpec& candidate : options_)
          if (candidate.name == name) spec = &candidate;
      } else {
        for (const OptionSpec& candidate : options_)
          if (candidate.short_name == word[1]) spec = &candidate;
        if (spec) name = spec->name;
        if (spec && word.size() > 2) {  // -j4, -ofile: the value attached to a short option
          if (spec->value_name.empty()) spec = nullptr;
          else inline_value = word.substr(2);
        }
      }
      if (!spec) throw UsageError("unknown option '" + word + "' for 'flashgen " + name_ + "'", args.usage_);
      std::string value;
      if (spec->value_name.empty()) {
        if (inline_value) throw UsageError("--" + name + " takes no value", args.usage_);
      } else if (inline_value) {
        value = *inline_value;
      } else {
        if (i + 1 >= argv.size()) throw UsageError(word + " needs a value (" + spec->value_name + ")", args.usage_);
        value = argv[++i];
      }
      std::vector<std::string>& slot = args.values_[name];
      if (!slot.empty() && !spec->repeatable) throw UsageError("--" + name + " given more than once", args.usage_);
      slot.push_back(value);
    }
    if (max_positionals_ >= 0 && args.positionals.size() > static_cast<size_t>(max_positionals_))
      throw UsageError("unexpected argument '" + args.positionals[max_positionals_] + "' for 'flashgen " + name_ + "'",
                       args.usage_);
    return args;
  }

  [[noreturn]] void usage_error(const std::string& message) const { throw UsageError(message, usage()); }

 private:
  std::string name_;
  std::string summary_;
  std::string synopsis_;
  std::string positional_help_;
  int max_positionals_;
  std::vector<OptionSpec> options_;
};

}  // namespace flashgen::cli
