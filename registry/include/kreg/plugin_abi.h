/* kreg plugin ABI, version 1.
 *
 * A kreg plugin is a shared object that exports one C symbol,
 *
 *     const kreg_plugin* kreg_plugin_v1(void);
 *
 * returning a static table that describes the plugin and its kernels. The
 * host probes the newest entry symbol it knows first and older ones after it
 * (today there is only v1).
 *
 * Rules
 * -----
 * Structs.      Every struct starts with `size_t struct_size`, set by whoever
 *               fills it in to sizeof() of the struct it was compiled with.
 *               Fields are only ever appended; a reader reads a field only if
 *               struct_size says it is there. No C++ or Abseil type crosses
 *               this boundary.
 * Ownership.    Everything reachable from the table returned by the entry
 *               symbol is owned by the plugin, is immutable, and lives until
 *               the host dlclose()s the plugin. The host never frees it.
 *               Argument structs, tensors, configs, workspaces and the host
 *               table passed into a call are owned by the host and are valid
 *               only for the duration of that call. Plugins must not keep
 *               pointers to them.
 * Tensors.      DLPack DLTensor (dlpack 0.6). Only kDLCPU tensors are passed
 *               today. `strides` may be NULL (compact row-major); otherwise
 *               it is in elements. Honour `byte_offset`.
 * Errors.       Functions return a kreg_status. On anything but KREG_OK they
 *               may write a NUL-terminated, one-line reason into the caller's
 *               buffer `msg` of `msg_cap` bytes (truncating as needed). `msg`
 *               is never NULL and msg_cap is at least 1.
 * NULLs.        A kernel's `check` and `workspace_bytes` may be NULL (always
 *               legal, no workspace); `run` may not. Optional tensors in the
 *               argument structs are NULL when absent.
 * Validation.   The host validates shapes, dtypes and strides before calling
 *               `run`; a plugin may rely on the argument contract documented
 *               on each args struct. `check` and `workspace_bytes` look at
 *               shapes, dtypes, strides and the config only, never at tensor
 *               data: the host may call them with shape-only tensors whose
 *               data pointer must not be read (tuning-table lookups).
 * Threads.      `check` and `workspace_bytes` must be thread-safe. `run` may
 *               be called concurrently on distinct outputs. A plugin may use
 *               threads internally. The host links oneTBB and, when
 *               kreg_host.num_threads is non-zero, calls `run` inside a oneTBB
 *               arena of that many threads, so oneTBB plugins need do
 *               nothing; a plugin using another runtime should honour it.
 * Versions.     kreg_kernel.version changes whenever the kernel's results or
 *               the meaning of its parameters change; tuned tables keyed on an
 *               older version are then stale.
 */
#ifndef KREG_PLUGIN_ABI_H_
#define KREG_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KREG_ABI_VERSION 1
#define KREG_PLUGIN_ENTRY_V1 "kreg_plugin_v1"

#if defined(__GNUC__)
#define KREG_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define KREG_PLUGIN_EXPORT
#endif

/* Status codes; the host maps them onto absl::StatusCode. */
typedef enum kreg_status {
  KREG_OK = 0,
  KREG_INVALID_ARGUMENT = 1,   /* arguments or configuration are not legal */
  KREG_UNIMPLEMENTED = 2,      /* legal, but this kernel does not do it */
  KREG_RESOURCE_EXHAUSTED = 3, /* out of memory or workspace too small */
  KREG_CANCELLED = 4,          /* kreg_host.cancelled() said stop */
  KREG_INTERNAL = 5            /* a bug in the plugin */
} kreg_status;

/* Instruction-set extensions a kernel may require (bit mask). The host runs
 * a kernel only if the CPU has every bit it asks for; a bit the host does not
 * know makes the kernel unavailable. */
enum {
  KREG_ISA_AVX2 = 1u << 0,
  KREG_ISA_FMA = 1u << 1,
  KREG_ISA_AVX512F = 1u << 2,
  KREG_ISA_AVX512BW = 1u << 3,
  KREG_ISA_AVX512VL = 1u << 4,
  KREG_ISA_AVX512DQ = 1u << 5,
  KREG_ISA_AVX512BF16 = 1u << 6,
  KREG_ISA_AVX512VNNI = 1u << 7,
  KREG_ISA_KNOWN_MASK = (1u << 8) - 1
};

/* How a parameter's value is given. */
typedef enum kreg_param_kind {
  KREG_PARAM_INT = 1,      /* one of `values` */
  KREG_PARAM_INT_LIST = 2, /* an increasing list drawn from `values`; the
                              kernel's check says which lists are legal */
  KREG_PARAM_CHOICE = 3    /* one of `choices`, passed as its index */
} kreg_param_kind;

/* One tunable parameter of a kernel. */
typedef struct kreg_param_desc {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+, unique within the kernel */
  const char* doc;  /* one line */
  kreg_param_kind kind;
  const int64_t* values; /* INT, INT_LIST: legal values / list elements */
  size_t num_values;
  const char* const* choices; /* CHOICE: the names */
  size_t num_choices;
  int64_t default_value;        /* INT: a member of values; CHOICE: index */
  const int64_t* default_list;  /* INT_LIST: the default list (may be empty) */
  size_t default_list_len;
} kreg_param_desc;

/* The value of one parameter in a configuration. */
typedef struct kreg_param_value {
  int64_t value;       /* INT: the value; CHOICE: the index */
  const int64_t* list; /* INT_LIST: the list */
  size_t list_len;
} kreg_param_value;

/* A configuration: one value per parameter, in the descriptor's order. */
typedef struct kreg_config {
  size_t struct_size;
  const kreg_param_value* values;
  size_t num_values;
} kreg_config;

/* What only the host owns. Any function pointer may be NULL. */
typedef struct kreg_host {
  size_t struct_size;
  void* ctx;
  int32_t num_threads;           /* 0: the host's default */
  int (*cancelled)(void* ctx);   /* non-zero: stop and return KREG_CANCELLED */
  void (*log)(void* ctx, int level, const char* message); /* 0 info, 1 warn */
  uint32_t isa; /* KREG_ISA_* bits a kernel may use for internal dispatch */
} kreg_host;

/* ---- Per-op argument structs ------------------------------------------- */

/* op "topk": the k best elements of each row, sorted best first.
 *
 * input    [batch, n]  float32 or bfloat16; strides[1] == 1.
 * k        0 <= k <= n.
 * largest  non-zero: largest first; zero: smallest first.
 * row_starts, row_ends  optional int32 [batch] (NULL: 0 and n). Row r
 *          considers only columns [row_starts[r], row_ends[r]),
 *          0 <= start <= end <= n.
 * values   [batch, k]  same dtype as input; strides[1] == 1.
 * indices  [batch, k]  int32 global column indices; strides[1] == 1.
 * stats    optional int32 [batch]: a per-row statistic the kernel documents
 *          (topk/blockwise: the depth d whose top-d of every block was the
 *          superset, m-1 when the rule held at m, k when the row fell back;
 *          a row cut into column chunks reports its deepest chunk).
 *
 * Order: NaN (either sign) compares above +inf; -0 equals +0; equal values
 * are ordered by ascending index. A row whose range holds fewer than k
 * elements fills its tail with index -1 and value -inf (largest) or +inf
 * (smallest). */
typedef struct kreg_topk_args {
  size_t struct_size;
  const DLTensor* input;
  int64_t k;
  int32_t largest;
  const DLTensor* row_starts;
  const DLTensor* row_ends;
  DLTensor* values;
  DLTensor* indices;
  DLTensor* stats;
} kreg_topk_args;

/* ---- Kernels and plugins ----------------------------------------------- */

/* One kernel variant. `args` points at the op's argument struct. */
typedef struct kreg_kernel {
  size_t struct_size;
  const char* op;      /* e.g. "topk" */
  const char* variant; /* e.g. "radix"; registered as op/variant */
  uint32_t version;    /* >= 1 */
  const char* doc;     /* one line */
  uint32_t required_isa; /* KREG_ISA_* bits */
  const kreg_param_desc* params;
  size_t num_params;
  /* Is `config` legal for `args`? KREG_INVALID_ARGUMENT with a reason if
   * not. May be NULL. */
  kreg_status (*check)(const kreg_config* config, const void* args, char* msg,
                       size_t msg_cap);
  /* Scratch memory `run` needs. May be NULL (none). */
  kreg_status (*workspace_bytes)(const kreg_config* config, const void* args,
                                 size_t* bytes, char* msg, size_t msg_cap);
  /* Compute. `workspace` has at least workspace_bytes() bytes, 64-byte
   * aligned, uninitialised (NULL when zero bytes). */
  kreg_status (*run)(const kreg_config* config, const void* args,
                     void* workspace, size_t workspace_size,
                     const kreg_host* host, char* msg, size_t msg_cap);
} kreg_kernel;

typedef struct kreg_plugin {
  size_t struct_size;
  uint32_t abi_version; /* KREG_ABI_VERSION the plugin was built against */
  const char* name;     /* e.g. "topk" */
  const char* version;  /* the plugin's own version string */
  const kreg_kernel* kernels;
  size_t num_kernels;
} kreg_plugin;

typedef const kreg_plugin* (*kreg_plugin_entry_v1)(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KREG_PLUGIN_ABI_H_ */
