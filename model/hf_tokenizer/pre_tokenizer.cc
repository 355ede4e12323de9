#include "model/hf_tokenizer/pre_tokenizer.h"

#include "model/hf_tokenizer/regex.h"

namespace kappa::model::hf {
namespace {

// The pattern GPT-2's ByteLevel splits with when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin, end;
  bool is_match;
};

// The pieces of `text` as matches and the gaps between them, covering it.
std::vector<Span> MatchesAndGaps(const Regex& regex, const std::string& text, bool invert) {
  std::vector<Span> spans;
  size_t copied = 0;
  for (const auto& [begin, end] : regex.FindAll(text)) {
    if (begin > copied) spans.push_back({copied, begin, invert});
    spans.push_back({begin, end, !invert});
    copied = end;
  }
  if (copied < text.size()) spans.push_back({copied, text.size(), invert});
  return spans;
}

// Hugging Face tokenizers' SplitDelimiterBehavior, applied to the spans.
std::vector<Span> ApplyBehavior(std::vector<Span> spans, Behavior behavior) {
  std::vector<Span> out;
  switch (behavior) {
    case Behavior::kIsolated:
      return spans;
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
    }
  }
  return spans;
}

class RegexSplit final : public PreTokenizer {
 public:
  RegexSplit(std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void Split(std::vector<std::string>* pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces->size());
    for (const std::string& piece : *pieces) {
      for (const Span& s : ApplyBehavior(MatchesAndGaps(*regex_, piece, invert_), behavior_)) {
        if (s.end > s.begin) out.push_back(piece.substr(s.begin, s.end - s.begin));
      }
    }
    *pieces = std::move(out);
  }

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelSplit final : public PreTokenizer {
 public:
  ByteLevelSplit(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        gpt2_(use_regex ? std::make_unique<RegexSplit>(std::make_unique<Regex>(kGpt2Pattern),
                                                       Behavior::kIsolated, false)
                        : nullptr) {}
  void Split(std::vector<std::string>* pieces) const override {
    if (add_prefix_space_) {
      for (std::string& piece : *pieces) {
        if (piece.empty() || piece[0] != ' ') piece.insert(0, " ");
      }
    }
    if (gpt2_) gpt2_->Split(pieces);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<RegexSplit> gpt2_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void Split(std::vector<std::string>* pieces) const override {
    for (const auto& step : steps_) step->Split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Behavior BehaviorFromJson(const JsonNode& node) {
  const std::string name = node.String("behavior");
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  node.Field("behavior").Fail("unknown behavior \"" + name + "\"");
}

constexpr char kImplemented[] = "Split, ByteLevel, Sequence";

// One step; *byte_level is set when it is ByteLevel.
std::unique_ptr<PreTokenizer> StepFromJson(const JsonNode& node, bool* byte_level) {
  const std::string type = node.String("type");
  if (type == "Split") {
    return std::make_unique<RegexSplit>(RegexFromPatternJson(node.Field("pattern")),
                                        BehaviorFromJson(node),
                                        node.BoolOr("invert", false));
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    return std::make_unique<ByteLevelSplit>(node.BoolOr("add_prefix_space", true),
                                            node.BoolOr("use_regex", true));
  }
  node.Unsupported(type, kImplemented);
}

}  // namespace

PreTokenizerSpec PreTokenizerFromJson(const JsonNode& node) {
  PreTokenizerSpec spec;
  if (node.value.is_null()) return spec;
  if (node.String("type") != "Sequence") {
    spec.pre_tokenizer = StepFromJson(node, &spec.byte_level);
    return spec;
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  for (const JsonNode& item : node.Field("pretokenizers").Items()) {
    if (spec.byte_level) {
      item.Fail("follows a ByteLevel step; kappa runs ByteLevel only as the last step");
    }
    steps.push_back(StepFromJson(item, &spec.byte_level));
  }
  spec.pre_tokenizer = std::make_unique<Sequence>(std::move(steps));
  return spec;
}

}  // namespace kappa::model::hf
