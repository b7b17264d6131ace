// The host table (kreg_host) kernels and plugins are called with outside a
// run. Private to the registry.
#ifndef KREG_REGISTRY_SRC_HOST_TABLE_H_
#define KREG_REGISTRY_SRC_HOST_TABLE_H_

#include "kreg/plugin_abi.h"

namespace kreg {

// A host table for calls outside a run (check, workspace_bytes, a plugin's
// init): this CPU's ISA, no threads, no cancel flag, logging to kreg's log.
// Lives for the process.
const kreg_host& PlainHost();

}  // namespace kreg

#endif  // KREG_REGISTRY_SRC_HOST_TABLE_H_
