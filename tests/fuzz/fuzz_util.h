// Shared by the fuzz targets in tests/fuzz/: a private scratch directory for the inputs that the
// parsers read from files, and the check that turns a broken promise into a crash the fuzzer
// records.
//
// Every target is a function LLVMFuzzerTestOneInput(data, size). It is linked twice: with
// libFuzzer (clang, -DTESSERA_FUZZ=ON) to search for inputs, and with replay_main.cc (any
// compiler) to run the checked-in corpus and regressions as a CTest test. A parser that throws
// tessera::Error is the expected outcome for bad input; the targets catch nothing else, so any
// other exception, a crash, a sanitizer report or an oversized allocation is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "tessera/core/error.h"

namespace tessera::fuzz {

// A directory for this process alone (under $TMPDIR, else /tmp), created on first use and
// removed at exit.
const std::filesystem::path& scratch_dir();

// Writes the bytes to scratch_dir() / name, replacing any previous contents; returns the path.
std::filesystem::path write_input(std::string_view name, const uint8_t* data, size_t size);
// The same for any path. System calls interrupted by a signal (libFuzzer's -timeout alarm
// interrupts them every second) are retried.
void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size);

// Called with each tessera::Error a target catches; prints it when TESSERA_FUZZ_VERBOSE is set
// (to see why a saved input is rejected: TESSERA_FUZZ_VERBOSE=1 replay_<target> FILE).
void rejected(const Error& e);

// Aborts with `what` on stderr unless `ok`: a property of a successful parse did not hold.
void require(bool ok, const char* what);

}  // namespace tessera::fuzz

// The entry point libFuzzer calls (and replay_main.cc).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
