// PLACEHOLDER: replaced by the real subcommand.
#include "commands.h"
namespace tessera::app {
void register_eval(CLI::App& root, int& exit_code) { (void)root; (void)exit_code; }
}  // namespace tessera::app
