// Small tokenizer.json files in the shapes of the real ones, for the
// tokenizer's unit tests and its fuzzer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

#include "model/hf_tokenizer/byte_level.h"

namespace kappa::model::testing_tokenizers {

using nlohmann::json;

// A byte-level BPE over the 256 bytes with merges h+e, l+l, he+ll (ids 256..)
// and two added tokens, shaped like Qwen's tokenizer.json.
inline json ByteLevelTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[hf::BytesToAlphabet(std::string(1, static_cast<char>(b)))] = b;
  }
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["Ġw"] = 259;
  return {
      {"version", "1.0"},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"vocab", vocab},
        {"merges", {"h e", "l l", "he ll", "Ġ w"}}}},
      {"added_tokens",
       {{{"id", 300}, {"content", "<|end|>"}, {"special", true}, {"lstrip", false},
         {"rstrip", false}, {"normalized", false}, {"single_word", false}},
        {{"id", 301}, {"content", "<think>"}, {"special", false}, {"lstrip", false},
         {"rstrip", false}, {"normalized", false}, {"single_word", false}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
  };
}

// Llama 2 / Mistral tokenizer.json shape: Prepend + Replace normalizer, no
// pre-tokenizer, byte_fallback, unk with fuse_unk, <s> template.
inline json SentencePieceTokenizer(bool byte_fallback) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\u2581", 3}, {"a", 4},
                {"b", 5},     {"\u2581a", 6}, {"ab", 7}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 8 + b;
  }
  return {
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", byte_fallback},
        {"vocab", vocab}, {"merges", {"\u2581 a", "a b"}}}},
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
  };
}

}  // namespace kappa::model::testing_tokenizers
