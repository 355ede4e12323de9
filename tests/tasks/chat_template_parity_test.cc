// kappa's chat-template rendering against real jinja2, byte for byte: every
// template of chat_template_reference/templates.json (the npm tokenizers'
// and the public templates under templates/) x every message list of
// cases.json x add_generation_prompt true/false. The expectations come from
// render_reference.py (jinja2 in transformers' environment), written by the
// chat_template_reference ctest fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tasks/chat_template.h"

namespace kappa::tasks {
namespace {

using Json = nlohmann::ordered_json;

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

std::string ModelDir(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), name = spec.substr(colon + 1);
  if (kind == "hf") return std::string(KAPPA_HF_TOKENIZERS) + "/" + name;
  return std::string(KAPPA_CHAT_REFERENCE_DIR) + "/templates/" + name;
}

// Printable excerpt: control characters escaped.
std::string Excerpt(const std::string& text, size_t center) {
  const size_t begin = center > 40 ? center - 40 : 0;
  const std::string part = text.substr(begin, 80);
  std::string out;
  for (unsigned char c : part) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\x%02x", c);
      out += buffer;
    } else {
      out += static_cast<char>(c);
    }
  }
  return "\"" + out + "\"";
}

std::string FirstDifference(const std::string& expected, const std::string& actual) {
  size_t offset = 0;
  while (offset < expected.size() && offset < actual.size() && expected[offset] == actual[offset]) {
    ++offset;
  }
  return absl::StrCat("first difference at byte ", offset, " (expected ", expected.size(),
                      " bytes, got ", actual.size(), ")\n    jinja2: ", Excerpt(expected, offset),
                      "\n    kappa:  ", Excerpt(actual, offset));
}

std::vector<ChatMessage> Messages(const Json& list) {
  std::vector<ChatMessage> messages;
  for (const Json& m : list) {
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return messages;
}

// The case's variables over the template's, as render_reference.py merges them.
std::string ContextJson(const Json& template_entry, const Json& case_entry) {
  Json context = Json::object();
  for (const Json* entry : {&template_entry, &case_entry}) {
    if (!entry->contains("context")) continue;
    for (const auto& [key, value] : entry->at("context").items()) context[key] = value;
  }
  return context.empty() ? "" : context.dump();
}

// jinja2's message must match where kappa reproduces Python's text
// (raise_exception's TemplateError and UndefinedError); for other Python
// exceptions the type must.
std::string CompareError(const Json& error, const absl::Status& status) {
  const std::string type = error.at("type").get<std::string>();
  const std::string message = error.at("message").get<std::string>();
  const bool exact = type == "TemplateError" || type == "UndefinedError";
  const std::string wanted = exact ? absl::StrCat(type, ": ", message) : absl::StrCat(type, ": ");
  const bool ok = status.code() == absl::StatusCode::kInvalidArgument &&
                  (exact ? absl::EndsWith(status.message(), wanted)
                         : absl::StrContains(status.message(), wanted));
  if (ok) return "";
  return absl::StrCat("jinja2 raised ", type, ": ", message, "\n    kappa: ", status.ToString());
}

TEST(ChatTemplateParityTest, EveryTemplateAndCaseRendersAsJinja2) {
  const Json manifest = ReadJson(std::string(KAPPA_CHAT_REFERENCE_DIR) + "/templates.json");
  const Json cases = ReadJson(std::string(KAPPA_CHAT_REFERENCE_DIR) + "/cases.json").at("cases");
  const Json expected = ReadJson(KAPPA_CHAT_EXPECTED).at("results");
  ASSERT_GE(cases.size(), 50u);

  std::map<std::tuple<std::string, size_t, bool>, const Json*> by_key;
  for (const Json& result : expected) {
    by_key[{result.at("template").get<std::string>(), result.at("case").get<size_t>(),
            result.at("add_generation_prompt").get<bool>()}] = &result;
  }
  const auto& templates = manifest.at("templates");
  ASSERT_EQ(by_key.size(), templates.size() * cases.size() * 2)
      << "the reference renderings do not cover templates.json x cases.json";

  int compared = 0, failures = 0;
  for (const Json& entry : templates) {
    const std::string name = entry.at("name").get<std::string>();
    absl::StatusOr<ChatTemplate> chat_template = LoadChatTemplate(ModelDir(entry.at("dir")));
    ASSERT_TRUE(chat_template.ok()) << name << ": " << chat_template.status();
    for (size_t index = 0; index < cases.size(); ++index) {
      const Json& case_entry = cases[index];
      for (const bool add_generation_prompt : {true, false}) {
        const Json& reference = *by_key.at({name, index, add_generation_prompt});
        ChatRenderOptions options;
        options.add_generation_prompt = add_generation_prompt;
        options.extra_context_json = ContextJson(entry, case_entry);
        const absl::StatusOr<std::string> rendered =
            chat_template->Render(Messages(case_entry.at("messages")), options);
        std::string problem;
        if (reference.contains("error")) {
          problem = rendered.ok() ? "jinja2 raised " + reference.at("error").dump() +
                                        " but kappa rendered " + Excerpt(*rendered, 0)
                                  : CompareError(reference.at("error"), rendered.status());
        } else if (!rendered.ok()) {
          problem = "kappa failed: " + rendered.status().ToString();
        } else if (*rendered != reference.at("output").get<std::string>()) {
          problem = FirstDifference(reference.at("output").get<std::string>(), *rendered);
        }
        ++compared;
        if (problem.empty()) continue;
        if (++failures <= 25) {
          ADD_FAILURE() << "template " << name << ", case " << index << " ("
                        << case_entry.at("name").get<std::string>()
                        << "), add_generation_prompt=" << add_generation_prompt << ": " << problem;
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << failures << " of " << compared << " renderings differ from jinja2";
  std::printf("compared %d renderings (%zu templates x %zu cases x 2)\n", compared,
              templates.size(), cases.size());
}

}  // namespace
}  // namespace kappa::tasks
