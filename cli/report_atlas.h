// The conflict atlas of `kappa report`: <run_dir>/conflict_atlas.jsonl (the
// learner's learner/conflict_atlas.h: per step, the response positions with
// the most negative K_DR, one JSON object per line) read into entries, and
// the run page's section that shows the most negative of them over the run.
//
// Reading is forgiving like metrics.jsonl's (cli/report_data.h): a partial
// last line is left out silently; a line that is not a JSON object with an
// integer "step" and a numeric "kdr" is skipped and reported as
// "<file>:<line>: why"; any other field may be missing or null (or of the
// wrong type: then it counts as missing).
//
// A resumed run appends the steps after its checkpoint again. The writer
// puts a step's lines together, most negative K_DR first, so a line starts
// a new block when its step differs from the line before it, or equals it
// with a more negative K_DR; a block whose step is not after every step
// read so far replaces the entries of that step and all later ones.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kappa::cli {

struct AtlasTeacherToken {
  std::string token;
  std::optional<double> prob;
};

// One line of conflict_atlas.jsonl.
struct AtlasEntry {
  int64_t step = 0;
  double kdr = 0.0;  // < 0 as the learner writes it
  std::string prompt;
  std::string response;                        // decoded, special tokens left out
  std::optional<int64_t> token_index;          // the token's index among the response tokens
  std::optional<std::string> token;            // the sampled token, decoded alone
  std::optional<double> student_prob;          // the sampling policy's probability of `token`
  std::optional<double> teacher_prob;          // the teacher's probability of `token`
  std::vector<AtlasTeacherToken> teacher_top;  // the teacher's most likely tokens
  std::optional<double> advantage;
  std::optional<double> reward;
  std::optional<std::string> subset;  // with a corrupted teacher: the rule's name or "rest"
};

struct ConflictAtlasFile {
  std::string path;                   // as named in messages
  std::vector<AtlasEntry> entries;    // after the resume rule above, in file order
  int64_t lines = 0;                  // non-empty lines read (not the partial tail)
  int64_t skipped_lines = 0;          // malformed lines left out
  std::vector<std::string> problems;  // "<file>:<line>: why", one per skipped line
  int64_t replaced_entries = 0;       // entries dropped because a resumed run repeated their step
  bool partial_tail = false;          // the file ended inside a line (run still writing)
};

// Parses conflict_atlas.jsonl text; `file_name` names it in `problems`.
ConflictAtlasFile ParseConflictAtlasText(const std::string& text, const std::string& file_name);

// <run_dir>/conflict_atlas.jsonl. NOT_FOUND when it does not exist (the run
// had monitor.atlas_positions: 0, or predates the atlas); UNAVAILABLE when it
// exists but cannot be read.
absl::StatusOr<ConflictAtlasFile> LoadConflictAtlas(const std::string& run_dir);

// The `count` entries with the most negative K_DR, most negative first (ties:
// earlier step, then file order).
std::vector<AtlasEntry> MostNegativeAtlasEntries(const std::vector<AtlasEntry>& entries,
                                                 size_t count);

// Where `entry.token` sits in `entry.response`: the byte offset of its
// occurrence at the token_index-th character (UTF-8) or byte, else of its
// only occurrence; unset when the token is empty, absent or ambiguous (then
// the page shows it beside the response instead).
std::optional<size_t> LocateAtlasToken(const AtlasEntry& entry);

// What the section draws besides the atlas itself.
struct AtlasContext {
  // K_DR response positions per subset over the steps the atlas covers
  // (metrics.jsonl's kdr_positions_by_subset); empty when the run has none.
  std::map<std::string, int64_t> positions_by_subset;
};

inline constexpr size_t kAtlasTableRows = 25;

// The page's section (HTML, every value escaped):
//   <section data-section="conflict_atlas">: a summary (entries, steps
//   covered, skipped lines; counts per response token index and, when the
//   entries carry one, per subset beside the subset's share of all K_DR
//   positions) and a table (class "atlas", rows class "atlas-row") of the
//   `rows` most negative entries, the conflicting token highlighted as
//   <mark class="atlas-token"> inside the response, or as <mark
//   class="atlas-token atlas-token-apart"> after it when it cannot be located.
// For an error `atlas` the section says why there is no table (NOT_FOUND: the
// run has no atlas).
std::string ConflictAtlasSectionHtml(const absl::StatusOr<ConflictAtlasFile>& atlas,
                                     const AtlasContext& context, size_t rows = kAtlasTableRows);

}  // namespace kappa::cli
