// Writes a whole file atomically: to a temporary file next to it, then a rename, so readers (and
// concurrent writers of the same content, e.g. ranks preparing the same cache) never see a
// partial file.
#pragma once

#include <filesystem>
#include <initializer_list>
#include <string_view>

namespace tessera::data {

// Creates the parent directories, writes the parts in order, renames into place. Throws IoError
// naming the path on failure.
void write_file_atomically(const std::filesystem::path& path,
                           std::initializer_list<std::string_view> parts);

}  // namespace tessera::data
