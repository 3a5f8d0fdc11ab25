// `tessera train`: every TrainConfig key is a flag (`--grad-clip`) and a JSON config key
// (`grad_clip`). Precedence, lowest first: defaults, the resumed checkpoint's config, --config
// FILE, flags given on the command line.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/io/atomic_file.h"
#include "tessera/train/metrics.h"
#include "tessera/train/stop_request.h"
#include "tessera/train/supervisor.h"
#include "tessera/train/trainer.h"

namespace tessera::app {
namespace {

struct TrainFlags {
  std::string config_file;
  bool print_config = false;
  // What the command line gave, by key: text for valued options, true/false for bare flags.
  std::map<std::string, std::string> text;
  std::map<std::string, bool> switches;
  std::map<std::string, CLI::Option*> options;  // key -> option
};

// A value as --help shows it (strings without quotes).
std::string shown(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

const char* type_name(const train::ConfigField& f) {
  switch (f.kind) {
    case train::ConfigField::Kind::Integer:
      return "INT";
    case train::ConfigField::Kind::Number:
      return "FLOAT";
    case train::ConfigField::Kind::Boolean:
      return "BOOL";
    default:
      return "TEXT";
  }
}

// Every key of train::train_config_fields() as a flag.
void add_config_flags(CLI::App* cmd, TrainFlags& f) {
  const train::TrainConfig defaults;
  for (const train::ConfigField& field : train::train_config_fields()) {
    const std::string name = train::flag_of(field.key);
    CLI::Option* o = nullptr;
    if (field.bare_flag) {
      o = cmd->add_flag(name, f.switches[field.key], field.help);
    } else {
      o = cmd->add_option(name, f.text[field.key], field.help)
              ->default_str(shown(field.get(defaults)))
              ->type_name(type_name(field))
              ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      if (!field.choices.empty()) o->check(CLI::IsMember(field.choices));
    }
    o->group(field.group);
    f.options[field.key] = o;
  }
}

// How the run stopped, and the command that continues it.
void report_stop(const train::TrainConfig& cfg, const train::TrainResult& r) {
  std::fflush(stdout);
  std::string how = detail::concat("tessera: stopped by ", train::signal_name(r.stopped_by),
                                   " after step ", r.steps, " of ", cfg.steps);
  if (cfg.save.empty()) {
    std::fprintf(stderr, "%s; nothing was saved (no --save was given), so it cannot be resumed\n",
                 how.c_str());
    return;
  }
  std::string launcher;
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && comm::launched_by_mpi())
    launcher = detail::concat("mpirun -np ", n, " ");
  std::fprintf(stderr, "%s; saved checkpoint %s. Resume with:\n  %s%s train --resume %s\n",
               how.c_str(), r.checkpoint.c_str(), launcher.c_str(), program_path(),
               cfg.save.c_str());
}

// The flags given on the command line, as JSON values of their keys.
nlohmann::json given_flags(TrainFlags& f) {
  nlohmann::json given = nlohmann::json::object();
  for (const train::ConfigField& field : train::train_config_fields()) {
    if (f.options.at(field.key)->count() == 0) continue;
    given[field.key] = field.bare_flag ? nlohmann::json(f.switches.at(field.key))
                                       : train::value_from_text(field, f.text.at(field.key));
  }
  return given;
}

// --init-from with no --lr (flag or config file) trains pretrained weights at the from-scratch
// default, which is 100x what fine-tuning usually takes: said once, by the process that reports
// (not each supervised attempt, not ranks other than 0), and nothing else changes.
void note_fine_tuning_rate(const train::TrainConfig& cfg, const nlohmann::json& file,
                           const nlohmann::json& given) {
  if (cfg.init_from.empty() || !cfg.resume.empty() || file.contains("lr") || given.contains("lr"))
    return;
  if (train::supervised()) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank != nullptr && std::string(rank) != "0") return;
  std::fprintf(stderr,
               "tessera: note: --init-from without --lr trains the loaded weights at the default "
               "%g, a rate for training from scratch; pretrained models are usually fine-tuned "
               "at 1e-5 to 1e-4 (Llama 2's supervised fine-tuning: 2e-5)\n",
               static_cast<double>(cfg.lr));
}

void run(TrainFlags& f, int& exit_code) {
  const nlohmann::json file =
      f.config_file.empty() ? nlohmann::json::object() : train::read_json_file(f.config_file);
  const nlohmann::json given = given_flags(f);
  train::TrainConfig cfg = train::resolve_train_config(file, given);
  if (f.print_config) {  // what would run, as a config file (every key)
    cfg.validate();
    std::printf("%s\n", train::to_json(cfg).dump(2).c_str());
    exit_code = 0;
    return;
  }
  note_fine_tuning_rate(cfg, file, given);
  // Fail before any work when the results could not be written (docs/RELIABILITY.md).
  if (!cfg.save.empty()) io::check_writable_directory(cfg.save);
  if (!cfg.flight_recorder.empty()) io::check_writable_directory(cfg.flight_recorder);
  if (cfg.max_restarts > 0 && !train::supervised()) {  // each attempt runs this command again
    TESSERA_CHECK_AS(ConfigError, !comm::launched_by_mpi(), config_key("max_restarts"),
                     " supervises the job from outside mpirun: start `", program_path(),
                     " train` without mpirun and give ", config_key("mpirun"),
                     " 'mpirun OPTIONS' (-np is added) to run each attempt's ranks as processes");
    cfg.validate();
    exit_code = train::supervise(cfg, command_line(), stderr);
    return;
  }
  if (!cfg.metrics.empty()) {
    train::MetricsWriter probe(cfg.metrics, /*append=*/true);
  }
  train::TrainResult r;
  {
    // SIGINT / SIGTERM stop the run cleanly after the current step (docs/RELIABILITY.md).
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    train::StopSignals signals(/*announce=*/world_rank == nullptr ||
                               std::string(world_rank) == "0");
    r = train::run_training(cfg, stdout);
  }
  exit_code = 0;
  if (r.stopped_by) {
    exit_code = 128 + r.stopped_by;  // as the shell reports a process ended by the signal
    if (r.rank == 0) report_stop(cfg, r);
    return;
  }
  if (r.rank != 0) return;  // under mpirun, rank 0 reports
  if (r.last_val_loss >= 0)
    std::printf("done: %lld steps, final val_loss %.4f (unigram entropy %.4f), %.0f tokens/s\n",
                static_cast<long long>(r.steps), r.last_val_loss, r.unigram_entropy,
                r.tokens_per_s);
  else if (r.tokens_per_s > 0)
    std::printf("done: %lld steps, %.0f tokens/s\n", static_cast<long long>(r.steps),
                r.tokens_per_s);
  else  // resumed at its last step: nothing left to run
    std::printf("done: %lld steps\n", static_cast<long long>(r.steps));
}

}  // namespace

void register_train(CLI::App& root, int& exit_code) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* cmd = root.add_subcommand(
      "train", "Train a GPT. With no flags: a small GPT-2 on Debian's fortunes corpus.");
  cmd->add_option("--config", f->config_file,
                  "JSON file with any of the keys below (flag names with '_' for '-'); flags "
                  "given on the command line win")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--print-config", f->print_config,
                "Print the configuration that would run (defaults, a resumed checkpoint's, "
                "--config and the flags, in that order of precedence) as JSON, and exit");
  add_config_flags(cmd, *f);
  cmd->callback([f, &exit_code]() { run(*f, exit_code); });
}

}  // namespace tessera::app
