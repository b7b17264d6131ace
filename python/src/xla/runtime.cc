#include "runtime.h"

#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kreg/log.h"

namespace kreg::xla {

absl::StatusOr<const Registry*> TheRegistry() {
  static const absl::StatusOr<const Registry*> registry = []() -> absl::StatusOr<const Registry*> {
    absl::StatusOr<std::unique_ptr<Registry>> loaded = Registry::Load({});
    if (!loaded.ok()) return loaded.status();
    for (const absl::Status& s : (*loaded)->refusals()) Log(LogLevel::kWarn, s.message());
    return loaded->release();  // kept for the process: kernels run from it until exit
  }();
  return registry;
}

namespace {

// "name=value name=v1,v2" back into Parse's overrides.
std::vector<std::pair<std::string, std::string>> ConfigPairs(absl::string_view config) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (absl::string_view item : absl::StrSplit(config, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> pair = absl::StrSplit(item, absl::MaxSplits('=', 1));
    pairs.push_back(std::move(pair));
  }
  return pairs;
}

absl::StatusOr<std::shared_ptr<const Chosen>> Parse(absl::string_view op, absl::string_view kernel,
                                                    absl::string_view config) {
  absl::StatusOr<const Registry*> registry = TheRegistry();
  if (!registry.ok()) return registry.status();
  absl::StatusOr<std::shared_ptr<const Kernel>> found = (*registry)->Get(kernel);
  if (!found.ok()) return found.status();
  if ((*found)->op() != op) {
    return absl::InvalidArgumentError(absl::StrCat("kernel ", kernel, " is not one of op ", op, "'s"));
  }
  absl::StatusOr<Config> parsed = (*found)->ParseConfig(ConfigPairs(config));
  if (!parsed.ok()) return parsed.status();
  return std::make_shared<const Chosen>(Chosen{*std::move(found), *std::move(parsed)});
}

// The pairs parsed so far, by "op\nkernel\nconfig". A shared lock for the
// common case (a pair seen before), as the Dispatcher's memo.
struct ChosenCache {
  std::shared_mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const Chosen>> pairs;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Chosen>> Choose(absl::string_view op, absl::string_view kernel,
                                                     absl::string_view config) {
  static ChosenCache& cache = *new ChosenCache;
  const std::string key = absl::StrCat(op, "\n", kernel, "\n", config);
  {
    std::shared_lock lock(cache.mu);
    if (auto it = cache.pairs.find(key); it != cache.pairs.end()) return it->second;
  }
  absl::StatusOr<std::shared_ptr<const Chosen>> parsed = Parse(op, kernel, config);
  if (!parsed.ok()) return parsed.status();
  std::unique_lock lock(cache.mu);
  if (cache.pairs.size() >= kMaxChosen) cache.pairs.clear();
  return cache.pairs.emplace(key, *std::move(parsed)).first->second;
}

}  // namespace kreg::xla

