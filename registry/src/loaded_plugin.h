// A dlopen()ed plugin, shared by the ops and kernels it provides; fini() and
// dlclose() run when the last of them goes (its code stays mapped: the
// registry opens plugins with RTLD_NODELETE). Private to the registry.
#ifndef KREG_REGISTRY_SRC_LOADED_PLUGIN_H_
#define KREG_REGISTRY_SRC_LOADED_PLUGIN_H_

#include <string>
#include <utility>

#include "kreg/plugin_abi.h"

namespace kreg {

class LoadedPlugin {
 public:
  LoadedPlugin(std::string path, void* handle, const kreg_plugin* table);
  ~LoadedPlugin();
  LoadedPlugin(const LoadedPlugin&) = delete;
  LoadedPlugin& operator=(const LoadedPlugin&) = delete;

  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const kreg_plugin* table() const { return table_; }
  // Set once init() succeeded, so fini() is called.
  void set_initialised() { initialised_ = true; }

 private:
  std::string path_;
  void* handle_;
  const kreg_plugin* table_;
  std::string name_, version_;
  bool initialised_ = false;
};

}  // namespace kreg

#endif  // KREG_REGISTRY_SRC_LOADED_PLUGIN_H_
