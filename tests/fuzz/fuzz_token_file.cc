// Fuzz target: a tessera token file (data/token_file.h). The input is opened as it is (checksum
// not verified, so the fuzzer is not stopped by it), read whole, and verified; then the same
// bytes with the checksum field recomputed go through prepare_data(), which detects the format
// by the magic and checks every id against the header's vocabulary.
#include <cstring>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/data/prepare.h"
#include "tessera/data/token_file.h"

using namespace tessera;

namespace {

void read_all(const data::TokenFile& f) {
  std::vector<int32_t> ids(static_cast<size_t>(f.size()));
  f.read(0, f.size(), ids.data());
  for (int64_t i = 0; i < f.size(); ++i) {
    fuzz::require(static_cast<uint32_t>(ids[static_cast<size_t>(i)]) == f.get(i),
                  "read() and get() agree");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_input("tokens.tsrtok", data, size);
  try {
    const auto f = data::TokenFile::open(path, {.verify_checksum = false});
    fuzz::require(static_cast<uint64_t>(f->size()) * static_cast<uint64_t>(f->token_bytes()) +
                          data::kTokenFileHeaderBytes ==
                      size,
                  "the header's token count matches the file size");
    read_all(*f);
    f->verify_checksum();
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed file.
  }
  if (size < data::kTokenFileHeaderBytes) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint64_t sum = stable_hash(
      std::string_view(reinterpret_cast<const char*>(fixed.data() + data::kTokenFileHeaderBytes),
                       size - data::kTokenFileHeaderBytes));
  for (int i = 0; i < 8; ++i) fixed[24 + i] = static_cast<uint8_t>(sum >> (8 * i));
  const auto fixed_path = fuzz::write_input("fixed.tsrtok", fixed.data(), fixed.size());
  try {
    const data::PreparedData p = data::prepare_data({.data = fixed_path});
    fuzz::require(p.format == data::DataFormat::kTokenFile, "the magic selects the token format");
    fuzz::require(p.tokens->size() > 0 && p.vocab_size > 0, "prepared tokens are not empty");
    fuzz::require(static_cast<int64_t>(p.tokens->max_id()) < p.vocab_size,
                  "prepared ids are below the vocabulary size");
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed file.
  }
  return 0;
}
