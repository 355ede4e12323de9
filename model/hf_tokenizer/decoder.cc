#include "model/hf_tokenizer/decoder.h"

#include "base/utf8.h"
#include "model/hf_tokenizer/regex.h"

namespace kappa::model::hf {
namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) bytes += token;
    *tokens = {base::LossyUtf8(bytes)};
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::string out;
      size_t copied = 0;
      for (const auto& [begin, end] : pattern_->FindAll(token)) {
        out.append(token, copied, begin - copied);
        out += content_;
        copied = end;
      }
      out.append(token, copied, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// "<0xXX>" -> its byte value, else -1.
int FallbackByte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string pending;  // bytes of consecutive <0xXX> tokens
    for (std::string& token : *tokens) {
      const int byte = FallbackByte(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      if (!pending.empty()) out.push_back(base::LossyUtf8(pending));
      pending.clear();
      out.push_back(std::move(token));
    }
    if (!pending.empty()) out.push_back(base::LossyUtf8(pending));
    *tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined += token;
    *tokens = {joined};
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from
// each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      size_t begin = 0, end = token.size();
      const size_t n = content_.size();
      for (size_t i = 0; i < start_ && end - begin >= n && token.compare(begin, n, content_) == 0;
           ++i) {
        begin += n;
      }
      for (size_t i = 0; i < stop_ && end - begin >= n && token.compare(end - n, n, content_) == 0;
           ++i) {
        end -= n;
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

size_t CountField(const JsonNode& node, const std::string& key) {
  const JsonNode field = node.Field(key);
  if (!field.value.is_number_integer() || field.value.get<int64_t>() < 0) {
    field.Fail("must be a non-negative integer");
  }
  return field.value.get<size_t>();
}

constexpr char kImplemented[] = "ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence";

}  // namespace

std::unique_ptr<Decoder> DecoderFromJson(const JsonNode& node) {
  if (node.value.is_null()) return nullptr;
  const std::string type = node.String("type");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(RegexFromPatternJson(node.Field("pattern")),
                                            node.String("content"));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(node.String("content"), CountField(node, "start"),
                                          CountField(node, "stop"));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const JsonNode& item : node.Field("decoders").Items()) {
      if (auto step = DecoderFromJson(item)) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  node.Unsupported(type, kImplemented);
}

}  // namespace kappa::model::hf
