// Durable file helpers for checkpoints (private to model/).
#pragma once

#include <string>
#include <string_view>

namespace kappa::model::internal {

// Writes `data` to `path` (truncating) and fsyncs it before returning, so a
// later rename publishes complete bytes. Throws std::runtime_error naming the file.
void WriteFileDurably(const std::string& path, std::string_view data);
// Whole file contents; throws std::runtime_error naming the file.
std::string ReadFile(const std::string& path);
// fsync of a directory, making renames/creations inside it durable.
void SyncDirectory(const std::string& path);

}  // namespace kappa::model::internal
