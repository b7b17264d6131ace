// The flags' validators and binders (tools/binders.h).
#include "tools/binders.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kreg/limits.h"

namespace kreg::cli {

CLI::Validator IntWithin(std::function<absl::Status(int64_t)> check) {
  return CLI::Validator(
      [check](std::string& text) -> std::string {
        int64_t v = 0;
        if (!absl::SimpleAtoi(text, &v)) return absl::StrCat("'", text, "' is not an integer");
        absl::Status s = check(v);
        return s.ok() ? std::string() : std::string(s.message());
      },
      "");
}

CLI::Validator SecondsWithin(limits::Zero zero) {
  return CLI::Validator(
      [zero](std::string& text) -> std::string {
        double v = 0;
        if (!absl::SimpleAtod(text, &v)) return absl::StrCat("'", text, "' is not a number");
        absl::Status s = limits::CheckSeconds(v, "", zero);
        return s.ok() ? std::string() : std::string(s.message());
      },
      "");
}

CLI::Validator NotBlank() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return absl::StripAsciiWhitespace(text).empty() ? "the value is empty" : std::string();
      },
      "");
}

CLI::Option* AddDims(CLI::App* c, Flags& f, const char* what) {
  return c->add_option("--dims", f.dims, what)
      ->option_text("NAME=V,...")
      ->check(NotBlank())
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void AddDtype(CLI::App* c, Flags& f) {
  c->add_option("--dtype", f.dtype,
                "element type of every tensor whose dtype is a choice (f32, bf16, i32), or NAME=TYPE,... per tensor "
                "(default: each tensor's first)")
      ->option_text("TYPE")
      ->check(NotBlank());
}

void AddWith(CLI::App* c, Flags& f) {
  c->add_option("--with", f.with, "optional inputs to generate at random, comma-separated (e.g. row_ends)")
      ->option_text("NAME,...")
      ->check(NotBlank());
}

void AddInput(CLI::App* c, Flags& f) {
  c->add_option("--input", f.inputs, "an input read from a .npy file instead of random data; repeatable")
      ->option_text("NAME=FILE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void AddDist(CLI::App* c, Flags& f) {
  c->add_option("--dist", f.dist, "random inputs: normal, uniform, bits or ties")->option_text("NAME")->capture_default_str();
}

void AddGenerate(CLI::App* c, Flags& f) {
  AddDist(c, f);
  c->add_option("--partition", f.partition, "group sizes (partition inputs): random, balanced or skewed")
      ->option_text("NAME")
      ->capture_default_str();
  c->add_option("--seed", f.seed, "random seed")->option_text("N")->capture_default_str()->check(IntWithin([](int64_t v) {
    return limits::CheckCount(v, "", 0, std::numeric_limits<int64_t>::max());
  }));
}

void AddThreads(CLI::App* c, Flags& f, const std::string& help) {
  c->add_option("--threads", f.threads, help)->option_text("N")->capture_default_str()->check(IntWithin([](int64_t v) {
    return limits::CheckThreads(v, "");
  }));
}

void AddMeasure(CLI::App* c, Flags& f) {
  c->add_option("--warmup", f.warmup, "untimed runs before timing")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckReps(v, "", 0); }));
  c->add_option("--reps", f.reps, "timed runs at most (fewer once the median is stable)")
      ->option_text("N")
      ->capture_default_str()
      ->check(IntWithin([](int64_t v) { return limits::CheckReps(v, "", 1); }));
  AddThreads(c, f, absl::StrCat("threads per kernel run (0: all cores; at most ", limits::kMaxThreads, ")"));
}

void AddComm(CLI::App* c, Flags& f) {
  c->add_option("--ranks", f.ranks,
                absl::StrCat("collective ops: run on N ranks, threads of this process (at most ",
                             limits::kMaxThreadRanks, ")"))
      ->option_text("N")
      ->check(IntWithin([](int64_t v) { return limits::CheckThreadRanks(v, ""); }));
  c->add_option("--backend", f.backend,
                "collective ops: threads (ranks are threads of this process) or mpi (this process is one rank "
                "of the job mpirun started)")
      ->option_text("NAME")
      ->capture_default_str();
  c->add_option("--mesh", f.mesh,
                "collective ops on a device mesh: its axes, 2x4 (axes x, y) or x=2,y=4; the ranks are its size")
      ->option_text("AXES");
  c->add_option("--comm-timeout,--comm_timeout", f.comm_timeout,
                "collective ops: seconds a rank waits for another before failing")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kRefused));
}

void AddLockTimeout(CLI::App* c, Flags& f) {
  c->add_option("--lock-timeout,--lock_timeout", f.lock_timeout,
                "seconds to wait for a table another process is writing (0: not at all)")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(SecondsWithin(limits::Zero::kAllowed));
}

void AddDataClass(CLI::App* c, Flags& f, const char* what) {
  c->add_option("--data-class,--data_class", f.data_class, what)->option_text("TEXT");
}

void AddDevice(CLI::App* c, Flags& f, const std::string& help) {
  c->add_option("--device", f.device, help)->option_text("NAME")->capture_default_str()->check(
      CLI::IsMember({"cpu", "cuda"}));
  c->add_flag("--warm", f.warm, "with --device cuda: time with the L2 warm (not flushed before each run)");
}

void AddTables(CLI::App* c, Flags& f) {
  c->add_option("--machine", f.machine,
                "whose measurements answer: similar (this machine's, else the most similar tuned machine's) or "
                "strict (this machine's only)")
      ->option_text("similar|strict")
      ->capture_default_str()
      ->check(CLI::IsMember({"similar", "strict"}));
  c->add_flag("--no-shipped,--no_shipped", f.no_shipped,
              "ask only --db, not the tables shipped with kreg (share/kreg/tables, or KREG_TABLE_PATH)");
}

}  // namespace kreg::cli
