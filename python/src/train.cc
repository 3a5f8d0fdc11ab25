// tessera.train: the trainer in this process (train::run_training, its ranks as threads), with a
// Python callback after each step (TrainHooks::on_step), progress written where Python's
// sys.stdout goes, and Ctrl-C stopping the run after the step it is in (with a checkpoint when
// `save` is set), as `tessera train` does.
#include <nanobind/ndarray.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "common.h"
#include "tessera/data/token_file.h"
#include "tessera/train/stop_request.h"
#include "tessera/train/trainer.h"

namespace tessera::python {
namespace {

// A FILE* whose writes go to Python's sys.stdout (a notebook's cell, a redirected stream): line
// buffered, and not a terminal, so the progress line prints every log_every steps instead of
// redrawing itself with carriage returns.
// Called inside C stdio with the FILE locked: nothing may escape it (an exception would leave the
// FILE locked). Text that is not UTF-8 (a tiny model's sample) is written with replacements.
ssize_t write_to_python(void*, const char* buf, size_t n) {
  nb::gil_scoped_acquire locked;
  try {
    PyObject* text = PyUnicode_DecodeUTF8(buf, static_cast<Py_ssize_t>(n), "replace");
    if (!text) throw nb::python_error();
    nb::module_::import_("sys").attr("stdout").attr("write")(nb::steal(text));
  } catch (...) {  // a closed or odd stream: the text is dropped
    PyErr_Clear();
  }
  return static_cast<ssize_t>(n);
}

std::FILE* python_stdout() {
  cookie_io_functions_t io{};
  io.write = write_to_python;
  std::FILE* f = fopencookie(nullptr, "w", io);
  if (f) std::setvbuf(f, nullptr, _IOLBF, 1 << 14);
  return f;
}

// The per-step hook around a Python callback (called on rank 0's thread, which holds no GIL):
// the record as a dict; False stops the run after the step (request_stop, as a signal would); an
// exception is kept for the caller to raise and stops the run the same way.
struct CallbackState {
  std::optional<nb::python_error> error;
  bool stopped = false;
};

// The hook borrows `callback` (the caller keeps it alive for the run): copies of the hook are
// destroyed by the trainer without the GIL, where no Python reference may be released.
std::function<void(const nlohmann::json&)> step_hook(nb::handle callback, CallbackState& state) {
  return [callback, &state](const nlohmann::json& record) {
    nb::gil_scoped_acquire locked;
    if (state.stopped) return;
    try {
      nb::object r = callback(to_python(record));
      if (!r.is_none() && !nb::cast<bool>(r)) {
        state.stopped = true;
        train::request_stop(SIGINT);
      }
    } catch (nb::python_error& e) {
      state.error.emplace(std::move(e));
      state.stopped = true;
      train::request_stop(SIGINT);
    }
  };
}

// "terminal": this process's stdout (a terminal: the redrawn line); "python": sys.stdout through
// python_stdout(); "none": silent.
nb::dict train(nb::handle file, nb::handle given, nb::object callback, const std::string& log_to,
               bool handle_signals) {
  const nlohmann::json fj = to_json(file), gj = to_json(given);
  CallbackState state;
  train::TrainHooks hooks;
  if (!callback.is_none()) hooks.on_step = step_hook(callback, state);
  std::FILE* log = nullptr;
  std::FILE* cookie = nullptr;
  if (log_to == "terminal") {
    log = stdout;
  } else if (log_to == "python") {
    log = cookie = python_stdout();
  }
  train::TrainResult r;
  train::TrainConfig cfg;
  try {
    nb::gil_scoped_release unlocked;
    cfg = train::resolve_train_config(fj, gj);
    std::optional<train::StopSignals> signals;
    if (handle_signals)
      signals.emplace(/*announce=*/true);
    else
      train::clear_stop_request();
    r = train::run_training(cfg, log, hooks);
    if (log) std::fflush(log);
  } catch (...) {
    if (cookie) std::fclose(cookie);
    throw;
  }
  if (cookie) std::fclose(cookie);
  if (state.error) {
    state.error->restore();
    throw nb::python_error();
  }
  nlohmann::json out = {{"rank", r.rank},
                        {"first_step", r.first_step},
                        {"steps", r.steps},
                        {"losses", r.losses},
                        {"last_val_loss", r.last_val_loss},
                        {"unigram_entropy", r.unigram_entropy},
                        {"tokens_per_s", r.tokens_per_s},
                        {"sample", r.sample},
                        {"memory_peaks", r.memory_peaks},
                        {"model_state_peaks", r.model_state_peaks},
                        {"comm_bytes_per_step", r.comm_bytes_per_step},
                        {"checkpoint", r.checkpoint},
                        {"config", train::to_json(cfg)}};
  if (r.stopped_by != 0)
    out["stopped_by"] =
        state.stopped ? std::string("callback") : std::string(train::signal_name(r.stopped_by));
  else
    out["stopped_by"] = nullptr;
  return nb::borrow<nb::dict>(to_python(out));
}

void write_tokens(const std::string& path,
                  nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu, uint32_t, nb::ndim<1>> tokens,
                  uint32_t vocab) {
  const std::span<const uint32_t> s(tokens.data(), tokens.shape(0));
  nb::gil_scoped_release unlocked;
  data::write_token_file(path, s, vocab);
}

// The benchmark of the hook alone (python/bench/callback_overhead.py): seconds per call of the
// trainer's per-step hook around `callback`, called `calls` times with `record` from a thread
// without the GIL, as rank 0's thread calls it after each step.
double time_step_hook(nb::object callback, nb::handle record, int calls) {
  const nlohmann::json r = to_json(record);
  CallbackState state;
  const std::function<void(const nlohmann::json&)> hook = step_hook(callback, state);
  double seconds = 0;
  {
    nb::gil_scoped_release unlocked;
    std::thread rank0([&] {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) hook(r);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    rank0.join();
  }
  if (state.error) {
    state.error->restore();
    throw nb::python_error();
  }
  if (state.stopped) train::clear_stop_request();
  return seconds / calls;
}

}  // namespace

void register_train(nb::module_& m) {
  m.def("_train", &train, nb::arg("file"), nb::arg("given"), nb::arg("callback").none(),
        nb::arg("log_to"), nb::arg("handle_signals"));
  m.def("_time_step_hook", &time_step_hook, nb::arg("callback"), nb::arg("record"),
        nb::arg("calls"));
  m.def("_write_token_file", &write_tokens, nb::arg("path"), nb::arg("tokens"), nb::arg("vocab"));
  m.def("_config_keys", [] {
    nb::list keys;
    for (const train::ConfigField& f : train::train_config_fields()) keys.append(f.key);
    return keys;
  });
}

}  // namespace tessera::python
