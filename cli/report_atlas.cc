#include "cli/report_atlas.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/jsonl_lines.h"
#include "cli/report_html.h"
#include "cli/report_svg.h"

namespace kappa::cli {
namespace {

// --- reading

std::optional<double> NumberField(const nlohmann::json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return std::nullopt;
  const double value = it->get<double>();
  return std::isfinite(value) ? std::optional<double>(value) : std::nullopt;
}

std::optional<std::string> StringField(const nlohmann::json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::optional<int64_t> IndexField(const nlohmann::json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_number_integer()) return std::nullopt;
  const int64_t value = it->get<int64_t>();
  return value >= 0 ? std::optional<int64_t>(value) : std::nullopt;
}

std::vector<AtlasTeacherToken> TeacherTop(const nlohmann::json& record) {
  std::vector<AtlasTeacherToken> top;
  auto it = record.find("teacher_top");
  if (it == record.end() || !it->is_array()) return top;
  for (const nlohmann::json& item : *it) {
    if (!item.is_object()) continue;
    std::optional<std::string> token = StringField(item, "token");
    if (!token) continue;
    top.push_back({*std::move(token), NumberField(item, "prob")});
  }
  return top;
}

// Why `record` cannot be an atlas entry, or empty when it can.
std::string Rejection(const nlohmann::json& record) {
  if (!record.is_object()) return "not a JSON object";
  auto step = record.find("step");
  if (step == record.end()) return "no \"step\" field";
  if (!step->is_number_integer()) return "\"step\" is not an integer";
  if (!NumberField(record, "kdr")) return "\"kdr\" is missing or not a finite number";
  return "";
}

AtlasEntry EntryFromJson(const nlohmann::json& record) {
  AtlasEntry entry;
  entry.step = record["step"].get<int64_t>();
  entry.kdr = *NumberField(record, "kdr");
  entry.prompt = StringField(record, "prompt").value_or("");
  entry.response = StringField(record, "response").value_or("");
  entry.token_index = IndexField(record, "token_index");
  entry.token = StringField(record, "token");
  entry.student_prob = NumberField(record, "student_prob");
  entry.teacher_prob = NumberField(record, "teacher_prob");
  entry.teacher_top = TeacherTop(record);
  entry.advantage = NumberField(record, "advantage");
  entry.reward = NumberField(record, "reward");
  entry.subset = StringField(record, "subset");
  return entry;
}

// The resume rule of the header, one accepted entry at a time.
class ResumeFilter {
 public:
  explicit ResumeFilter(ConflictAtlasFile* atlas) : atlas_(atlas) {}

  void Add(AtlasEntry entry) {
    const bool new_block =
        !previous_ || entry.step != previous_->step || entry.kdr < previous_->kdr;
    if (new_block && latest_step_ && entry.step <= *latest_step_) {
      DropFromStep(entry.step);  // every entry left is of an earlier step
      latest_step_ = entry.step;
    }
    latest_step_ = latest_step_ ? std::max(*latest_step_, entry.step) : entry.step;
    previous_ = entry;
    atlas_->entries.push_back(std::move(entry));
  }

 private:
  void DropFromStep(int64_t step) {
    std::vector<AtlasEntry>& entries = atlas_->entries;
    const size_t before = entries.size();
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [step](const AtlasEntry& e) { return e.step >= step; }),
                  entries.end());
    atlas_->replaced_entries += static_cast<int64_t>(before - entries.size());
  }

  ConflictAtlasFile* atlas_;
  std::optional<AtlasEntry> previous_;
  std::optional<int64_t> latest_step_;
};

// --- rendering

constexpr const char* kAtlasStyle = R"css(
section.atlas-section table.atlas td { max-width: 260px; }
.atlas-response { white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; }
.atlas-prompt { white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; }
mark.atlas-token { background: #f4a3a3; color: #000; padding: 0 1px; border-radius: 2px; }
mark.atlas-token-apart { margin-left: 6px; outline: 1px dashed #c44; }
.atlas-top { display: block; white-space: nowrap; font-size: 12px; }
.atlas-top.same-token code { font-weight: 700; }
.atlas-bar { display: inline-block; height: 8px; background: #1f77b4; vertical-align: middle;
             margin: 0 4px; }
)css";

std::string Percent(const std::optional<double>& probability) {
  if (!probability) return "–";
  return absl::StrFormat("%.1f%%", 100.0 * *probability);
}

// A token as text a reader can see: spaces and line breaks made visible.
std::string VisibleToken(const std::string& token) {
  if (token.empty()) return "∅";
  std::string out;
  for (char c : token) {
    switch (c) {
      case ' ':
        out += "␣";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string TokenCode(const std::string& token) {
  return absl::StrCat("<code>", XmlEscape(VisibleToken(token)), "</code>");
}

std::string ResponseHtml(const AtlasEntry& entry) {
  const std::string token = entry.token.value_or("");
  std::string html = "<span class=\"atlas-response\">";
  if (std::optional<size_t> at = LocateAtlasToken(entry)) {
    absl::StrAppend(&html, XmlEscape(entry.response.substr(0, *at)), "<mark class=\"atlas-token\">",
                    XmlEscape(token), "</mark>",
                    XmlEscape(entry.response.substr(*at + token.size())), "</span>");
    return html;
  }
  absl::StrAppend(&html, XmlEscape(entry.response), "</span>");
  if (entry.token) {
    absl::StrAppend(&html,
                    "<mark class=\"atlas-token atlas-token-apart\" title=\"not located in the "
                    "decoded response\">",
                    XmlEscape(VisibleToken(token)), "</mark>");
  }
  return html;
}

std::string TeacherTopHtml(const AtlasEntry& entry) {
  if (entry.teacher_top.empty()) return "–";
  constexpr double kBarPixels = 60;
  std::string html;
  for (const AtlasTeacherToken& top : entry.teacher_top) {
    const double p = std::clamp(top.prob.value_or(0.0), 0.0, 1.0);
    const bool same = entry.token && top.token == *entry.token;
    absl::StrAppend(
        &html, "<span class=\"atlas-top", same ? " same-token" : "", "\">", TokenCode(top.token),
        "<span class=\"atlas-bar\" style=\"width:", absl::StrFormat("%.0f", kBarPixels * p),
        "px\"></span>", Percent(top.prob), "</span>");
  }
  return html;
}

std::string EntryRow(const AtlasEntry& entry, bool with_subset) {
  std::string row = absl::StrCat(
      "<tr class=\"atlas-row\" data-step=\"", entry.step, "\"><td class=\"num\">", entry.step,
      "</td><td class=\"num\">", FormatValue(entry.kdr), "</td><td><span class=\"atlas-prompt\">",
      XmlEscape(entry.prompt), "</span></td><td>", ResponseHtml(entry), "</td><td class=\"num\">",
      entry.token_index ? absl::StrCat(*entry.token_index) : "–", "</td><td>",
      entry.token ? TokenCode(*entry.token) : "–", " ", Percent(entry.student_prob),
      "</td><td class=\"num\">", Percent(entry.teacher_prob), "</td><td>", TeacherTopHtml(entry),
      "</td><td class=\"num\">", FormatValue(entry.advantage), "</td><td class=\"num\">",
      FormatValue(entry.reward), "</td>");
  if (with_subset) absl::StrAppend(&row, "<td>", XmlEscape(entry.subset.value_or("–")), "</td>");
  return row + "</tr>\n";
}

std::string EntryTable(const std::vector<AtlasEntry>& shown, bool with_subset) {
  std::string html =
      "<table class=\"atlas\"><thead><tr><th>step</th><th>K_DR</th><th>prompt</th>"
      "<th>response (token highlighted)</th><th>token index</th><th>sampled token, p_student</th>"
      "<th>p_teacher</th><th>teacher's top tokens</th><th>advantage</th><th>reward</th>";
  if (with_subset) absl::StrAppend(&html, "<th>subset</th>");
  absl::StrAppend(&html, "</tr></thead><tbody>\n");
  for (const AtlasEntry& entry : shown) absl::StrAppend(&html, EntryRow(entry, with_subset));
  return html + "</tbody></table>\n";
}

std::string Share(int64_t part, int64_t whole) {
  if (whole <= 0) return "–";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

// Counts per response token index; indices from kFolded on share a row.
std::string TokenIndexTable(const std::vector<AtlasEntry>& entries) {
  constexpr int64_t kFolded = 16;
  std::map<int64_t, int64_t> counts;  // -1: no index
  for (const AtlasEntry& e : entries) {
    ++counts[e.token_index ? std::min(*e.token_index, kFolded) : -1];
  }
  const int64_t total = static_cast<int64_t>(entries.size());
  std::string html =
      "<table class=\"atlas-where\" data-table=\"atlas_token_index\"><thead><tr><th>response "
      "token index</th><th>entries</th><th>share</th></tr></thead><tbody>\n";
  for (const auto& [index, count] : counts) {
    const std::string label = index < 0          ? std::string("unknown")
                              : index == kFolded ? absl::StrCat("≥ ", kFolded)
                                                 : absl::StrCat(index);
    absl::StrAppend(&html, TableRow(absl::StrCat("token_index_", label), label,
                                    {absl::StrCat(count), Share(count, total)}));
  }
  return html + "</tbody></table>\n";
}

bool AnySubset(const std::vector<AtlasEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(),
                     [](const AtlasEntry& e) { return e.subset.has_value(); });
}

std::string SubsetTable(const std::vector<AtlasEntry>& entries, const AtlasContext& context) {
  std::map<std::string, int64_t> counts;
  for (const AtlasEntry& e : entries) ++counts[e.subset.value_or("(none)")];
  int64_t all_positions = 0;
  for (const auto& [name, positions] : context.positions_by_subset) all_positions += positions;
  const bool with_positions = all_positions > 0;
  const int64_t total = static_cast<int64_t>(entries.size());
  std::string html =
      "<table class=\"atlas-where\" data-table=\"atlas_subset\"><thead><tr><th>subset</th>"
      "<th>entries</th><th>share of entries</th>";
  if (with_positions) absl::StrAppend(&html, "<th>share of all K_DR positions</th>");
  absl::StrAppend(&html, "</tr></thead><tbody>\n");
  for (const auto& [name, count] : counts) {
    std::vector<std::string> cells = {absl::StrCat(count), Share(count, total)};
    if (with_positions) {
      auto it = context.positions_by_subset.find(name);
      cells.push_back(
          Share(it == context.positions_by_subset.end() ? 0 : it->second, all_positions));
    }
    absl::StrAppend(&html, TableRow(absl::StrCat("subset_", name), XmlEscape(name), cells));
  }
  return html + "</tbody></table>\n";
}

std::string SummaryHtml(const ConflictAtlasFile& atlas, size_t shown) {
  std::set<int64_t> steps;
  for (const AtlasEntry& e : atlas.entries) steps.insert(e.step);
  std::string html =
      absl::StrCat("<p class=\"meta\" data-atlas-entries=\"", atlas.entries.size(), "\">",
                   XmlEscape(atlas.path), " — ", atlas.entries.size(), " entries");
  if (!steps.empty()) {
    absl::StrAppend(&html, " over ", steps.size(), " steps (", *steps.begin(), "–", *steps.rbegin(),
                    ")");
  }
  absl::StrAppend(&html, "; the ", shown, " with the most negative K_DR below");
  if (atlas.replaced_entries > 0) {
    absl::StrAppend(&html, "; ", atlas.replaced_entries, " replaced by a resumed run");
  }
  absl::StrAppend(&html, ".</p>\n");
  std::vector<std::string> notices;
  if (atlas.skipped_lines > 0) {
    notices.push_back(absl::StrCat(atlas.skipped_lines, " malformed line",
                                   atlas.skipped_lines == 1 ? "" : "s", " skipped"));
    constexpr size_t kShown = 10;
    for (size_t i = 0; i < atlas.problems.size() && i < kShown; ++i) {
      notices.push_back(XmlEscape(atlas.problems[i]));
    }
  }
  if (atlas.partial_tail)
    notices.push_back("the last line is incomplete (run still writing?); left out");
  if (!notices.empty()) {
    absl::StrAppend(&html, "<div class=\"notice\"><ul>");
    for (const std::string& notice : notices) absl::StrAppend(&html, "<li>", notice, "</li>");
    absl::StrAppend(&html, "</ul></div>\n");
  }
  return html;
}

std::string NoAtlasHtml(const absl::Status& status) {
  if (absl::IsNotFound(status)) {
    return "<p class=\"meta\">This run has no conflict atlas (conflict_atlas.jsonl): "
           "<code>monitor.atlas_positions: 0</code>, or a run from before the atlas.</p>\n";
  }
  return absl::StrCat("<div class=\"notice\">The conflict atlas could not be read: ",
                      XmlEscape(std::string(status.message())), "</div>\n");
}

// The byte offset of the `index`-th UTF-8 character of `text`, if it has one.
std::optional<size_t> CharacterOffset(const std::string& text, int64_t index) {
  int64_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) continue;  // continuation byte
    if (seen++ == index) return i;
  }
  return std::nullopt;
}

}  // namespace

ConflictAtlasFile ParseConflictAtlasText(const std::string& text, const std::string& file_name) {
  ConflictAtlasFile atlas;
  atlas.path = file_name;
  ResumeFilter filter(&atlas);
  ForEachJsonLine(text, Rejection, [&](JsonLine& line) {
    if (!line.why.empty() && !line.terminated) {
      atlas.partial_tail = true;  // still being written, not damage
      return;
    }
    ++atlas.lines;
    if (!line.why.empty()) {
      ++atlas.skipped_lines;
      atlas.problems.push_back(absl::StrCat(file_name, ":", line.number, ": ", line.why));
      return;
    }
    filter.Add(EntryFromJson(line.record));
  });
  return atlas;
}

absl::StatusOr<ConflictAtlasFile> LoadConflictAtlas(const std::string& run_dir) {
  const std::string path = run_dir + "/conflict_atlas.jsonl";
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    if (error) return absl::UnavailableError(absl::StrCat(path, ": ", error.message()));
    return absl::NotFoundError(absl::StrCat(path, ": not found"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::UnavailableError(absl::StrCat(path, ": cannot be opened"));
  std::stringstream text;
  text << file.rdbuf();
  return ParseConflictAtlasText(text.str(), path);
}

std::vector<AtlasEntry> MostNegativeAtlasEntries(const std::vector<AtlasEntry>& entries,
                                                 size_t count) {
  std::vector<AtlasEntry> sorted = entries;
  std::stable_sort(sorted.begin(), sorted.end(), [](const AtlasEntry& a, const AtlasEntry& b) {
    if (a.kdr != b.kdr) return a.kdr < b.kdr;
    return a.step < b.step;
  });
  if (sorted.size() > count) sorted.resize(count);
  return sorted;
}

std::optional<size_t> LocateAtlasToken(const AtlasEntry& entry) {
  if (!entry.token || entry.token->empty()) return std::nullopt;
  const std::string& token = *entry.token;
  const std::string& response = entry.response;
  auto matches_at = [&](size_t offset) {
    return response.compare(offset, token.size(), token) == 0;
  };
  if (entry.token_index) {
    if (std::optional<size_t> at = CharacterOffset(response, *entry.token_index);
        at && matches_at(*at)) {
      return at;
    }
    const size_t byte = static_cast<size_t>(*entry.token_index);
    if (byte < response.size() && matches_at(byte)) return byte;
  }
  const size_t first = response.find(token);
  if (first == std::string::npos || response.find(token, first + 1) != std::string::npos) {
    return std::nullopt;
  }
  return first;
}

std::string ConflictAtlasSectionHtml(const absl::StatusOr<ConflictAtlasFile>& atlas,
                                     const AtlasContext& context, size_t rows) {
  std::string html =
      absl::StrCat("<section class=\"atlas-section\" data-section=\"conflict_atlas\">\n<style>",
                   kAtlasStyle, "</style>\n");
  if (!atlas.ok()) return absl::StrCat(html, NoAtlasHtml(atlas.status()), "</section>\n");
  const std::vector<AtlasEntry> shown = MostNegativeAtlasEntries(atlas->entries, rows);
  absl::StrAppend(&html, SummaryHtml(*atlas, shown.size()));
  if (atlas->entries.empty()) {
    return absl::StrCat(
        html,
        "<p class=\"meta\">No entry: no step had a position with K_DR &lt; 0.</p>\n</section>\n");
  }
  const bool with_subset = AnySubset(atlas->entries);
  absl::StrAppend(&html, "<div class=\"atlas-where-tables\">", TokenIndexTable(atlas->entries));
  if (with_subset) absl::StrAppend(&html, SubsetTable(atlas->entries, context));
  absl::StrAppend(&html, "</div>\n", EntryTable(shown, with_subset), "</section>\n");
  return html;
}

}  // namespace kappa::cli
