#include "model/hf_tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>
#include <stdexcept>

#include "base/utf8.h"
#include "model/hf_tokenizer/byte_level.h"

namespace kappa::model::hf {
namespace {

std::string FallbackToken(unsigned char byte) {
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "<0x%02X>", byte);
  return buffer;
}

// A merges entry: "left right" (older files) or ["left", "right"].
std::pair<std::string, std::string> MergeParts(const JsonNode& entry) {
  if (entry.value.is_array() && entry.value.size() == 2 && entry.value[0].is_string() &&
      entry.value[1].is_string()) {
    return {entry.value[0].get<std::string>(), entry.value[1].get<std::string>()};
  }
  if (entry.value.is_string()) {
    const std::string line = entry.value.get<std::string>();
    const size_t space = line.find(' ');
    if (space != std::string::npos && line.find(' ', space + 1) == std::string::npos) {
      return {line.substr(0, space), line.substr(space + 1)};
    }
  }
  entry.Fail("a merge must be \"left right\" or [\"left\", \"right\"]");
}

void RefuseOption(const JsonNode& model, const std::string& key, const std::string& why) {
  if (!model.Has(key)) return;
  const nlohmann::json& v = model.value.at(key);
  const bool neutral = (v.is_string() && v.get<std::string>().empty()) ||
                       (v.is_boolean() && !v.get<bool>());
  if (!neutral) model.Field(key).Fail(why + " is not implemented by kappa");
}

}  // namespace

BpeModel BpeModel::FromJson(const JsonNode& model, bool byte_level) {
  const std::string type = model.String("type");
  if (type != "BPE") model.Unsupported(type, "BPE");
  RefuseOption(model, "dropout", "BPE dropout");
  RefuseOption(model, "continuing_subword_prefix", "a continuing_subword_prefix");
  RefuseOption(model, "end_of_word_suffix", "an end_of_word_suffix");

  BpeModel bpe;
  bpe.byte_level_ = byte_level;
  bpe.byte_fallback_ = model.BoolOr("byte_fallback", false);
  bpe.ignore_merges_ = model.BoolOr("ignore_merges", false);
  bpe.fuse_unk_ = model.BoolOr("fuse_unk", false);

  const JsonNode vocab = model.Field("vocab");
  if (!vocab.value.is_object()) vocab.Fail("must be an object of token -> id");
  // The id table is dense (ids index it), so an id far past the number of
  // tokens would allocate for nothing: real vocabularies number their
  // tokens 0..N-1. (A fuzzer found {"a": 712140173} taking gigabytes.)
  const int64_t id_bound = 4 * static_cast<int64_t>(vocab.value.size()) + 65536;
  for (const auto& [file_token, id_value] : vocab.value.items()) {
    if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 ||
        id_value.get<int64_t>() > INT32_MAX) {
      vocab.Fail("the id of \"" + file_token + "\" must be a non-negative integer");
    }
    if (id_value.get<int64_t>() >= id_bound) {
      vocab.Fail("the id of \"" + file_token + "\" (" + std::to_string(id_value.get<int64_t>()) +
                 ") is far past the vocabulary's " + std::to_string(vocab.value.size()) +
                 " tokens (ids must be below 4 x tokens + 65536; kappa keeps a dense id table)");
    }
    const auto id = static_cast<int32_t>(id_value.get<int64_t>());
    std::string token = file_token;
    if (byte_level) {
      // A token outside the alphabet keeps its UTF-8 bytes, as the Hugging
      // Face ByteLevel decoder does; byte-level BPE never produces it.
      if (auto bytes = AlphabetToBytes(file_token)) token = std::move(*bytes);
    }
    if (static_cast<size_t>(id) >= bpe.id_to_token_.size()) {
      bpe.id_to_token_.resize(id + 1);
      bpe.has_id_.resize(id + 1, false);
    }
    if (bpe.has_id_[id]) vocab.Fail("id " + std::to_string(id) + " is given to two tokens");
    if (!bpe.token_to_id_.emplace(token, id).second) {
      vocab.Fail("\"" + file_token + "\" spells the same bytes as another token");
    }
    bpe.id_to_token_[id] = token;
    bpe.has_id_[id] = true;
  }

  for (int b = 0; b < 256; ++b) {
    const auto byte = static_cast<unsigned char>(b);
    const auto single = bpe.Lookup(std::string(1, static_cast<char>(byte)));
    bpe.byte_id_[b] = byte_level && single ? *single : -1;
    const auto fallback = bpe.Lookup(FallbackToken(byte));
    bpe.fallback_id_[b] = fallback ? *fallback : -1;
  }

  if (model.Has("unk_token")) {
    const std::string unk = model.String("unk_token");
    const auto id = bpe.FileTokenToId(unk);
    if (!id) model.Field("unk_token").Fail("\"" + unk + "\" is not in the vocabulary");
    bpe.unk_id_ = static_cast<int32_t>(*id);
  }

  const std::vector<JsonNode> merges = model.Field("merges").Items();
  bpe.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = MergeParts(merges[rank]);
    const auto left_id = bpe.FileTokenToId(left);
    const auto right_id = bpe.FileTokenToId(right);
    const auto merged_id = bpe.FileTokenToId(left + right);
    if (!left_id || !right_id || !merged_id) {
      merges[rank].Fail("\"" + left + "\" + \"" + right + "\": " +
                        (!left_id || !right_id ? "a part" : "the merged token") +
                        " is not in the vocabulary");
    }
    bpe.merges_[PairKey(static_cast<int32_t>(*left_id), static_cast<int32_t>(*right_id))] =
        Merge{static_cast<int32_t>(rank), static_cast<int32_t>(*merged_id)};
  }
  return bpe;
}

std::optional<int32_t> BpeModel::Lookup(std::string_view token) const {
  const auto it = token_to_id_.find(std::string(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> BpeModel::FileTokenToId(std::string_view token) const {
  if (!byte_level_) return Lookup(token);
  if (auto bytes = AlphabetToBytes(token)) {
    if (auto id = Lookup(*bytes)) return id;
  }
  return Lookup(token);
}

const std::string* BpeModel::IdToToken(int64_t id) const {
  if (id < 0 || id >= id_limit() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

std::optional<std::string> BpeModel::IdToFileToken(int64_t id) const {
  const std::string* token = IdToToken(id);
  if (token == nullptr) return std::nullopt;
  if (!byte_level_) return *token;
  // Tokens kept in their UTF-8 spelling (outside the alphabet) read back as is.
  const std::string spelled = BytesToAlphabet(*token);
  return FileTokenToId(spelled) == id ? spelled : *token;
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// One symbol per byte (byte-level) or per character, falling back to <0xXX>
// tokens or unk_token as bpe/model.rs's merge_word does.
std::vector<BpeModel::Symbol> BpeModel::InitialSymbols(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id, size_t len) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, static_cast<uint32_t>(len)});
  };
  if (byte_level_) {
    for (char c : word) {
      const int32_t id = byte_id_[static_cast<unsigned char>(c)];
      if (id < 0) {
        throw std::runtime_error("BPE: the byte-level vocabulary has no token for byte " +
                                 FallbackToken(static_cast<unsigned char>(c)));
      }
      add(id, 1);
    }
  } else {
    // An unk symbol not yet added (fuse_unk grows it over consecutive misses).
    size_t pending_unk_len = 0;
    auto flush_unk = [&] {
      if (pending_unk_len > 0) add(*unk_id_, pending_unk_len);
      pending_unk_len = 0;
    };
    size_t offset = 0;
    while (offset < word.size()) {
      const size_t begin = offset;
      base::NextCodePoint(word, &offset);
      const std::string_view unit = word.substr(begin, offset - begin);
      if (const auto id = Lookup(unit)) {
        flush_unk();
        add(*id, unit.size());
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : unit) all = all && fallback_id_[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          for (char c : unit) add(fallback_id_[static_cast<unsigned char>(c)], 1);
          continue;
        }
      }
      if (!unk_id_) {
        throw std::runtime_error("BPE: no token for \"" + std::string(unit) +
                                 "\" and the model has neither byte_fallback nor an unk_token");
      }
      if (!fuse_unk_) flush_unk();
      pending_unk_len += unit.size();
    }
    flush_unk();
  }
  if (!symbols.empty()) symbols.back().next = -1;
  return symbols;
}

// word.rs's merge_all: a queue of candidate merges ordered by (rank, position);
// a candidate whose pair changed since it was queued is skipped.
void BpeModel::MergeAll(std::vector<Symbol>* symbols) const {
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Symbol>& s = *symbols;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (const Merge* m = FindMerge(s[i].id, s[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = s[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    Symbol& right = s[left.next];
    const Merge* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next != -1) s[left.next].prev = top.pos;
    if (left.prev != -1) {
      if (const Merge* p = FindMerge(s[left.prev].id, left.id)) {
        queue.push({p->rank, left.prev, p->new_id});
      }
    }
    if (left.next != -1) {
      if (const Merge* n = FindMerge(left.id, s[left.next].id)) {
        queue.push({n->rank, top.pos, n->new_id});
      }
    }
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int64_t>* ids) const {
  if (ignore_merges_) {
    if (const auto id = Lookup(word)) {
      ids->push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols = InitialSymbols(word);
  MergeAll(&symbols);
  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    ids->push_back(symbols[i].id);
  }
}

}  // namespace kappa::model::hf
