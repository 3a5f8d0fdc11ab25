// Loading a known set of tensors (a model's parameters) from a safetensors file, with checks that
// name the missing tensor, the tensor of the wrong shape, or the unexpected extra tensors.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/io/safetensors.h"

namespace tessera::io {

struct ExpectedTensor {
  std::string name;
  Shape shape;
};

struct TensorLoadOptions {
  // A file name starting with one of these is matched without it ("transformer.h.0..." is
  // "h.0..."), as in Hugging Face GPT2LMHeadModel files.
  std::vector<std::string> strip_prefixes = {"transformer."};
  // Names (after stripping) that may be present without being expected; they are skipped. '*'
  // matches one or more characters other than '.'. Defaults: the tied output embedding and the
  // attention-mask buffers that Hugging Face GPT-2 files contain.
  std::vector<std::string> ignore = {"lm_head.weight", "h.*.attn.bias", "h.*.attn.masked_bias"};
  // Any other unexpected tensor is an error; when false it is only reported.
  bool error_on_unexpected = true;
};

struct TensorLoadReport {
  std::vector<std::string> ignored;     // file names skipped by `ignore`
  std::vector<std::string> unexpected;  // file names neither expected nor ignored
};

// Checks `file` against `expected` (missing, shape, unexpected; nothing is read until all checks
// pass) and returns the tensors converted to F32, keyed by expected name. Throws IoError.
std::map<std::string, Tensor> load_expected(const SafetensorsFile& file,
                                            const std::vector<ExpectedTensor>& expected,
                                            const TensorLoadOptions& options = {},
                                            MemCategory cat = MemCategory::Parameters,
                                            TensorLoadReport* report = nullptr);

// The same checks, with each destination's shape as the expectation; reads into the destinations
// (F32 tensors, e.g. views of a rank's flat parameter buffer).
TensorLoadReport load_into(const SafetensorsFile& file, const NamedTensors& destinations,
                           const TensorLoadOptions& options = {});

// A run of a stored tensor's elements: [offset, offset + n) of `name` (row-major in `shape`, the
// tensor's full shape) into dst. A rank that holds a piece of a tensor (a ZeRO shard, a
// tensor-parallel slice) reads just its runs, whatever layout wrote the file.
struct SliceRead {
  std::string name;
  Shape shape;
  int64_t offset = 0;
  int64_t n = 0;
  float* dst = nullptr;
};

// Checks every name (a "transformer." prefix is accepted) and full shape before reading anything,
// then reads. A missing tensor is an IoError that names it and adds `missing_hint`.
void load_slices(const SafetensorsFile& file, const std::vector<SliceRead>& reads,
                 const std::string& missing_hint = "");

// Glob match where '*' stands for one or more characters other than '.'.
bool name_matches(std::string_view pattern, std::string_view name);

}  // namespace tessera::io
