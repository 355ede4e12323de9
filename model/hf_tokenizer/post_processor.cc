#include "model/hf_tokenizer/post_processor.h"

namespace kappa::model::hf {
namespace {

// TemplateProcessing's "single" as ids, the sequence as -1.
std::vector<int64_t> SingleTemplate(const JsonNode& node) {
  const JsonNode special_tokens = node.Field("special_tokens");
  std::vector<int64_t> out;
  bool has_sequence = false;
  for (const JsonNode& item : node.Field("single").Items()) {
    if (item.Has("Sequence")) {
      if (item.Field("Sequence").String("id") != "A") item.Fail("a single template holds only A");
      out.push_back(-1);
      has_sequence = true;
    } else if (item.Has("SpecialToken")) {
      const std::string name = item.Field("SpecialToken").String("id");
      const JsonNode entry = special_tokens.Field(name);
      for (const JsonNode& id : entry.Field("ids").Items()) {
        if (!id.value.is_number_integer()) id.Fail("must be an integer");
        out.push_back(id.value.get<int64_t>());
      }
    } else {
      item.Fail("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!has_sequence) node.Field("single").Fail("has no Sequence");
  return out;
}

std::vector<int64_t> Compose(const std::vector<int64_t>& outer, const std::vector<int64_t>& inner) {
  std::vector<int64_t> out;
  for (int64_t id : outer) {
    if (id == -1) {
      out.insert(out.end(), inner.begin(), inner.end());
    } else {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace

PostProcessor PostProcessor::FromJson(const JsonNode& node) {
  PostProcessor processor;
  if (node.value.is_null()) return processor;
  const std::string type = node.String("type");
  if (type == "TemplateProcessing") {
    processor.single_template_ = SingleTemplate(node);
  } else if (type == "ByteLevel") {
    // Adjusts offsets only.
  } else if (type == "Sequence") {
    for (const JsonNode& item : node.Field("processors").Items()) {
      processor.single_template_ =
          Compose(FromJson(item).single_template_, processor.single_template_);
    }
  } else {
    node.Unsupported(type, "TemplateProcessing, ByteLevel, Sequence");
  }
  return processor;
}

std::vector<int64_t> PostProcessor::AddSpecialTokens(const std::vector<int64_t>& ids) const {
  return Compose(single_template_, ids);
}

}  // namespace kappa::model::hf
