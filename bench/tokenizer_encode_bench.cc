// Encode throughput of kappa's Hugging Face tokenizer, measured exactly as
// tests/model/tokenizer_reference/bench_encode.js measures transformers.js so
// that bench/tokenizer_encode_compare.sh can put the two side by side in one
// run:
//   kappa_bench_tokenizer_encode TOKENIZER_DIR CORPUS_FILE [--seconds S]
// The corpus is a JSONL file of JSON strings or, when a non-empty line is not
// a JSON string, a plain text file whose lines (each with its "\n") are the
// texts. Loading is not timed; one warm-up pass, then whole passes of
// Encode(text, add_special_tokens=false) over every text until S seconds
// (default 5) have passed. Prints one JSON line {"tokenizer", "bytes",
// "seconds", "mb_per_s", "tokens", "passes", "texts", "library"}.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "model/hf_tokenizer/hf_tokenizer.h"

namespace {

std::vector<std::string> ReadTexts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<std::string> texts;
  bool jsonl = true;
  for (const std::string& line : lines) {
    if (line.empty()) continue;
    const nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!value.is_string()) {
      jsonl = false;
      break;
    }
    texts.push_back(value.get<std::string>());
  }
  if (jsonl) return texts;
  texts.clear();
  for (const std::string& line : lines) texts.push_back(line + "\n");
  return texts;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 5 && std::string(argv[3]) == "--seconds")) {
    std::cerr << "usage: kappa_bench_tokenizer_encode TOKENIZER_DIR CORPUS_FILE [--seconds S]\n";
    return 2;
  }
  const double min_seconds = argc == 5 ? std::stod(argv[4]) : 5.0;
  try {
    const kappa::model::HfTokenizer tokenizer = kappa::model::HfTokenizer::Load(argv[1]);
    const std::vector<std::string> texts = ReadTexts(argv[2]);
    size_t pass_bytes = 0;
    for (const std::string& text : texts) pass_bytes += text.size();
    auto pass = [&] {
      size_t tokens = 0;
      for (const std::string& text : texts) tokens += tokenizer.Encode(text).size();
      return tokens;
    };
    pass();  // warm-up
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    size_t passes = 0, tokens = 0;
    double seconds = 0;
    do {
      tokens += pass();
      ++passes;
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
    } while (seconds < min_seconds);
    const double bytes = static_cast<double>(pass_bytes * passes);
    nlohmann::json result = {{"tokenizer", argv[1]},     {"bytes", bytes},
                             {"seconds", seconds},       {"mb_per_s", bytes / 1e6 / seconds},
                             {"tokens", tokens},         {"passes", passes},
                             {"texts", texts.size()},    {"library", "kappa"}};
    std::cout << result.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "kappa_bench_tokenizer_encode: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
