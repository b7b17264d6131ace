// The worker protocol's framing and decoding (internal): what both ends of
// autotune/worker.proto do with bytes and messages, apart from pipes and
// processes, so that it can be tested and fuzzed on its own (fuzz/).
//
// Thread-safety: the functions are thread-safe on distinct arguments.
#ifndef KREG_AUTOTUNE_SRC_WORKER_PROTOCOL_H_
#define KREG_AUTOTUNE_SRC_WORKER_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kreg/autotune.h"
#include "kreg/registry.h"
#include "kreg/worker.h"
#include "kreg/worker.pb.h"

namespace kreg::internal {

// A message larger than this is taken for garbage rather than waited for.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{256} << 20;

// `message` framed: a base-128 varint of its size, then its bytes.
std::string Frame(const google::protobuf::MessageLite& message);

enum class Unframe { kMessage, kMore, kBad };

// Takes one framed message off the front of *buffer into *message: kMore
// (buffer untouched) while the frame is incomplete; kBad for a varint over
// 10 bytes or a length over kMaxMessageBytes (buffer untouched), or for a
// body that does not parse (that frame consumed).
Unframe TakeMessage(std::string* buffer, google::protobuf::MessageLite* message);

// The tuner's reading of a worker's answer to a Run request: its Done as a
// Measurement, or kError when the reply is not a Done.
Measurement MeasurementFromReply(const worker::Reply& reply);

// The tuner's reading of a worker's answer to a Check request of
// `expected` candidates: one Legality per candidate, or kError for each when
// the reply is not a Checked of that many.
std::vector<Legality> LegalityFromReply(const worker::Reply& reply, size_t expected);

// Writes all of `s` to `fd` (retrying after signals); false when it could
// not.
bool WriteAll(int fd, const std::string& s);

// Name-value pairs (a kernel's parameters) as the protocol carries them.
void ToPairs(const std::vector<std::pair<std::string, std::string>>& pairs,
             google::protobuf::RepeatedPtrField<worker::Pair>* out);
std::vector<std::pair<std::string, std::string>> FromPairs(
    const google::protobuf::RepeatedPtrField<worker::Pair>& pairs);

// A measurement's status as a Done reply carries it, and back.
worker::Reply::Done::Status ToProto(TrialStatus s);
TrialStatus FromProto(worker::Reply::Done::Status s);

// The key of a candidate in a set of those that passed their check: every
// part framed by its length, so no byte in a name or value can make two
// keys collide.
std::string CandidateKey(const std::string& name, const Params& params);

// The worker's answer to a Check request: one Legality per candidate in
// `check`, appended to *checked — each candidate's parameters parsed for
// its kernel (looked up in `registry`) and checked against `args`
// (Kernel::Check: the op's validation, the values, the kernel's own check).
// `args` may be shape-only.
void AnswerCheck(const Registry& registry, const worker::Request::Check& check, const kreg_args& args,
                 worker::Reply::Checked* checked);

}  // namespace kreg::internal

#endif  // KREG_AUTOTUNE_SRC_WORKER_PROTOCOL_H_
