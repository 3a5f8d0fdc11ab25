// Each subcommand of the `tessera` command registers itself on the root CLI11 app. A callback
// stores its process exit status in `exit_code`; errors are thrown as tessera::Error.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tessera::app {

// The command as invoked (argv[0]), for the commands tessera suggests.
const char* program_path();
// The whole command line (argv), for a supervisor that starts the command again.
const std::vector<std::string>& command_line();

void register_train(CLI::App& root, int& exit_code);
void register_eval(CLI::App& root, int& exit_code);
void register_sample(CLI::App& root, int& exit_code);
void register_bench_comm(CLI::App& root, int& exit_code);
void register_schedule(CLI::App& root, int& exit_code);
void register_plot(CLI::App& root, int& exit_code);
void register_plan(CLI::App& root, int& exit_code);
void register_doctor(CLI::App& root, int& exit_code);

}  // namespace tessera::app
