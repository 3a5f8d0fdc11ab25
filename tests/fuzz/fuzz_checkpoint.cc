// Fuzz target: a checkpoint's state.json (io/checkpoint.h). A tiny checkpoint is saved once; each
// input replaces its state.json and the checkpoint directory is loaded, which reads `latest`,
// parses state.json and checks every recorded file's size and CRC-32 before mapping the files.
#include "checkpoint_fixture.h"
#include "fuzz_util.h"
#include "tessera/core/error.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = fuzz::scratch_dir() / "checkpoint";
  static const std::filesystem::path step_dir = fuzz::save_fixture_checkpoint(dir);
  fuzz::write_file(step_dir / io::kStateFile, data, size);
  try {
    const io::LoadedCheckpoint c = io::load_checkpoint(dir);
    fuzz::require(c.dir == step_dir, "the checkpoint `latest` names is loaded");
    fuzz::require(c.state.is_object(), "the caller's state is an object");
    fuzz::require(c.step >= 0, "the step is not negative");
    fuzz::require(c.config.n_embd == 2 && c.model.size() == 16 && c.optimizer.size() == 16,
                  "the loaded files are the fixture's");
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed state.json.
  }
  return 0;
}
