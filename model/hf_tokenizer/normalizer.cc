#include "model/hf_tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "base/utf8.h"
#include "model/hf_tokenizer/regex.h"

namespace kappa::model::hf {
namespace {

class UnicodeNormalization final : public Normalizer {
 public:
  explicit UnicodeNormalization(utf8proc_option_t options) : options_(options) {}
  void Apply(std::string* text) const override {
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text->data()),
                     static_cast<utf8proc_ssize_t>(text->size()), &result, options_);
    if (n < 0) throw std::runtime_error(std::string("normalizer: ") + utf8proc_errmsg(n));
    text->assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }

 private:
  utf8proc_option_t options_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void Apply(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace final : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Apply(std::string* text) const override {
    std::string out;
    size_t copied = 0;
    for (const auto& [begin, end] : pattern_->FindAll(*text)) {
      out.append(*text, copied, begin - copied);
      out += content_;
      copied = end;
    }
    out.append(*text, copied, std::string::npos);
    *text = std::move(out);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void Apply(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!base::IsUnicodeWhitespace(base::NextCodePoint(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && ((*text)[start] & 0xC0) == 0x80) --start;
        size_t probe = start;
        if (!base::IsUnicodeWhitespace(base::NextCodePoint(*text, &probe))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void Apply(std::string* text) const override {
    for (const auto& step : steps_) step->Apply(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

constexpr char kImplemented[] = "NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence";

}  // namespace

std::unique_ptr<Normalizer> NormalizerFromJson(const JsonNode& node) {
  if (node.value.is_null()) return nullptr;
  const std::string type = node.String("type");
  const auto stable = static_cast<utf8proc_option_t>(UTF8PROC_STABLE);
  if (type == "NFC") {
    return std::make_unique<UnicodeNormalization>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_COMPOSE));
  }
  if (type == "NFD") {
    return std::make_unique<UnicodeNormalization>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_DECOMPOSE));
  }
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalization>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalization>(
        static_cast<utf8proc_option_t>(stable | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(node.String("prepend"));
  if (type == "Replace") {
    return std::make_unique<Replace>(RegexFromPatternJson(node.Field("pattern")),
                                     node.String("content"));
  }
  if (type == "Strip") {
    return std::make_unique<Strip>(node.BoolOr("strip_left", true),
                                   node.BoolOr("strip_right", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const JsonNode& item : node.Field("normalizers").Items()) {
      if (auto step = NormalizerFromJson(item)) steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  node.Unsupported(type, kImplemented);
}

}  // namespace kappa::model::hf
