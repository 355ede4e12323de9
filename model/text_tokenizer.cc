#include "model/text_tokenizer.h"

#include <stdexcept>

namespace kappa::model {

TextTokenizer TextTokenizer::ForModel(const std::string& model_dir) {
  TextTokenizer tokenizer;
  if (HfTokenizer::Exists(model_dir)) tokenizer.hf_ = HfTokenizer::Load(model_dir);
  return tokenizer;
}

TextTokenizer TextTokenizer::Character() { return TextTokenizer(); }

std::vector<int64_t> TextTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (hf_) return hf_->Encode(text, add_special_tokens);
  return character_.Encode(text, /*add_bos=*/add_special_tokens);
}

std::string TextTokenizer::Decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // Ids without a token (padded embedding rows, holes in the id range) are
  // left out of the text.
  std::vector<int64_t> known;
  known.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < vocab_size() && (!hf_ || hf_->IdToToken(id))) known.push_back(id);
  }
  return hf_ ? hf_->Decode(known, skip_special_tokens) : character_.Decode(known);
}

int64_t TextTokenizer::vocab_size() const {
  return hf_ ? hf_->vocab_size() : character_.vocab_size();
}

std::string TextTokenizer::fingerprint() const {
  return hf_ ? hf_->fingerprint() : "kappa-char:" + character_.alphabet();
}

std::string TextTokenizer::source() const {
  return hf_ ? hf_->source() : "kappa's character tokenizer";
}

std::optional<std::string> TokenizerMismatch(const TextTokenizer& student,
                                             const TextTokenizer& teacher) {
  if (student.fingerprint() == teacher.fingerprint()) return std::nullopt;
  return "the student's tokenizer (" + student.source() + ", fingerprint " +
         student.fingerprint() + ", " + std::to_string(student.vocab_size()) +
         " ids) and the teacher's (" + teacher.source() + ", fingerprint " + teacher.fingerprint() +
         ", " + std::to_string(teacher.vocab_size()) +
         " ids) differ: on-policy distillation compares their distributions id by id, so both "
         "models must share one tokenizer (same vocabulary, merges and added tokens)";
}

}  // namespace kappa::model
