// `tessera doctor DIR`: what the flight recorder's dumps of a run say happened (comm/
// flight_doctor.h): one sentence naming the rank and the call, then the evidence.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "tessera/comm/flight_doctor.h"

namespace tessera::app {
namespace {

struct DoctorFlags {
  std::string dir;
  bool json = false;
};

void run(const DoctorFlags& f, int& exit_code) {
  const comm::Diagnosis d = comm::diagnose(comm::read_flight_dumps(f.dir));
  if (f.json) {
    std::printf("%s\n", d.to_json().dump(2).c_str());
  } else {
    std::printf("%s.\n", d.sentence.c_str());
    if (!d.evidence.empty()) std::printf("evidence:\n");
    for (const std::string& e : d.evidence) std::printf("  %s\n", e.c_str());
  }
  exit_code = 0;
}

}  // namespace

void register_doctor(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<DoctorFlags>();
  CLI::App* cmd = root.add_subcommand(
      "doctor",
      "Say what went wrong in a run from its flight recorder's dumps (tessera train "
      "--flight-recorder DIR, or TESSERA_FLIGHT_RECORDER=DIR): one sentence naming the rank and "
      "the call, then the evidence. It finds a dead rank (no dump, or one saying it exited), calls "
      "whose op or size disagree between ranks, a rank that never issued a call the others "
      "waited in, and a rank that issued a call late; otherwise it says whether every recorded "
      "call completed. It sees the collectives of the last calls each rank kept (4096 by "
      "default), matched by communicator and sequence number, on clocks aligned by wall time");
  cmd->add_option("dir", f->dir, "Directory holding the dumps (rank-<R>.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--json", f->json,
                "Print the diagnosis as JSON (diagnosis, sentence, rank, call, lag_s, evidence)");
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
