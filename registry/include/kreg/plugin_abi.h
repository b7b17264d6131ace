/* kreg plugin ABI, version 2.
 *
 * A kreg plugin is a shared object that exports one C symbol,
 *
 *     const kreg_plugin* kreg_plugin_v2(void);
 *
 * returning a static table: the plugin's name and version, the ops it
 * declares (if any) and the kernels it implements. An op is data: its named
 * tensors, dims and attributes (kreg_op_desc); the host derives validation,
 * random inputs, tuning keys, shape-only arguments and the command line from
 * it. A kernel implements one op; the kernel flagged KREG_KERNEL_REFERENCE is
 * that op's oracle. A plugin may declare ops only, kernels only (of ops other
 * plugins declare), or both.
 *
 * The host looks for kreg_plugin_v2 and refuses, naming the version, a
 * plugin that exports only another kreg_plugin_vN (N != 2) or whose table
 * says another abi_version.
 *
 * Rules
 * -----
 * Structs.      Every struct starts with `size_t struct_size`, set by whoever
 *               fills it in to sizeof() of the struct it was compiled with.
 *               Fields are only ever appended. A reader reads a field only if
 *               struct_size covers it (KREG_HAS_FIELD); a field not covered
 *               reads as zero / NULL. Each struct has a frozen minimum size
 *               (KREG_*_MIN_SIZE: its mandatory fields); smaller is refused,
 *               and every field past it is optional, zero meaning "none"
 *               (so C++ designated initialisers may leave them out; the
 *               build's kreg_add_plugin() turns off the warning for that).
 *               The host passes a complete kreg_host of its own version:
 *               read its fields past KREG_HOST_MIN_SIZE with KREG_HAS_FIELD.
 *               Arrays of structs are arrays of pointers, so a struct may
 *               grow without changing any stride. kreg_scalar is a union of
 *               two 8-byte scalars and never changes. No C++ or Abseil type
 *               crosses this boundary.
 * Ownership.    Everything reachable from the table returned by the entry
 *               symbol is owned by the plugin, immutable, and lives until the
 *               host calls `fini` and dlclose()s the plugin. Argument
 *               structs, tensors, configs, workspaces and the host table
 *               passed into a call are owned by the host and valid only for
 *               that call. A kernel's prepared state is owned by the kernel
 *               and freed by its `release`.
 * Tensors.      DLPack DLTensor (dlpack 0.6). The host guarantees that the
 *               last dimension of every tensor is contiguous (stride 1) and
 *               that rows do not overlap. Only kDLCPU tensors are passed
 *               today; a device backend may later pass kDLCUDA tensors with
 *               kreg_host.device set, and kernels refuse devices they do not
 *               speak. `strides` may be NULL (compact row-major); otherwise
 *               they are in elements. Honour `byte_offset`.
 * Arguments.    kreg_args holds the op's tensors in the op's order (NULL for
 *               an absent optional tensor), the op's dims resolved to values
 *               in the op's order (a dim the user left out that has a
 *               default_dim takes that dim's value), and every attribute
 *               (defaults filled in). Each tensor has the shape its
 *               descriptor's `shape` names, or `alt_shape` where that
 *               tensor's alt_shape_attr is non-zero in these args.
 *               The host validates shapes, dtypes, strides, dims and
 *               attribute ranges, then calls the op's `validate`, before any
 *               kernel function sees the args. With KREG_ARGS_SHAPE_ONLY set
 *               the tensors carry shapes and dtypes but their data must not
 *               be read (tuning-table lookups); only the op's `validate`
 *               and `default_variant` and kernels' `check` and
 *               `workspace_bytes` are called with them. The host never
 *               passes a NULL config or host table; validate and
 *               data_class must be thread-safe.
 * Errors.       Functions return a kreg_status. On anything but KREG_OK they
 *               may write a NUL-terminated, one-line reason into the caller's
 *               buffer `msg` of `msg_cap` bytes (truncating as needed). `msg`
 *               is never NULL and msg_cap is at least 1. No C++ exception may
 *               leave a plugin function.
 * NULLs.        Every function pointer but kreg_kernel.run may be NULL: no
 *               check (always legal), no workspace, no state, no validator.
 * Lifecycle.    init(host) once after loading, fini() once before unloading.
 *               The host never unmaps a plugin that passed its checks
 *               (RTLD_NODELETE: worker threads may still be returning
 *               through its code when the host lets it go), so its statics
 *               outlive fini, and loading the same file again in the process
 *               calls init on that same copy.
 *               Per problem: prepare(config, args) -> state (pack weights,
 *               build a plan, outside the timed run), then any number of
 *               run(config, args, state) with the same config and args (same
 *               tensors; in-out tensors are restored between runs by the
 *               host), then release(state). The host prepares again for
 *               other args. One state serves one run at a time.
 * Threads.      check, workspace_bytes, prepare and release must be
 *               thread-safe. `run` may be called concurrently on distinct
 *               outputs and states. The host links oneTBB and, when
 *               kreg_host.num_threads is non-zero, calls `run` inside a
 *               oneTBB arena of that many threads, so oneTBB plugins need do
 *               nothing; a plugin using another runtime should honour it.
 * Versions.     kreg_kernel.version changes whenever the kernel's results or
 *               the meaning of its parameters change; tuned tables keyed on
 *               an older version are then stale.
 */
#ifndef KREG_PLUGIN_ABI_H_
#define KREG_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KREG_ABI_VERSION 2
#define KREG_PLUGIN_ENTRY "kreg_plugin_v2"

#if defined(__GNUC__)
#define KREG_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define KREG_PLUGIN_EXPORT
#endif

/* Whether the struct at `ptr` (whose first field is struct_size) holds
 * `field` of `type`. */
#define KREG_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Status codes; the host maps them onto absl::StatusCode. */
typedef enum kreg_status {
  KREG_OK = 0,
  KREG_INVALID_ARGUMENT = 1,   /* arguments or configuration are not legal */
  KREG_UNIMPLEMENTED = 2,      /* legal, but this kernel does not do it */
  KREG_RESOURCE_EXHAUSTED = 3, /* out of memory or workspace too small */
  KREG_CANCELLED = 4,          /* kreg_host.cancelled() said stop */
  KREG_INTERNAL = 5,           /* a bug in the plugin */
  KREG_UNAVAILABLE = 6         /* a peer rank failed, or did not answer within
                                  the communicator's timeout */
} kreg_status;

/* Instruction-set extensions (bit mask). The host runs a kernel, or a
 * parameter choice, only if the CPU has every bit it asks for; a bit the host
 * does not know makes it unavailable. AMX bits are set only once the OS has
 * granted the process the AMX tile state. */
enum {
  KREG_ISA_AVX2 = 1u << 0,
  KREG_ISA_FMA = 1u << 1,
  KREG_ISA_AVX512F = 1u << 2,
  KREG_ISA_AVX512BW = 1u << 3,
  KREG_ISA_AVX512VL = 1u << 4,
  KREG_ISA_AVX512DQ = 1u << 5,
  KREG_ISA_AVX512BF16 = 1u << 6,
  KREG_ISA_AVX512VNNI = 1u << 7,
  KREG_ISA_AVX512FP16 = 1u << 8,
  KREG_ISA_AMX_TILE = 1u << 9,
  KREG_ISA_AMX_BF16 = 1u << 10,
  KREG_ISA_AMX_INT8 = 1u << 11,
  KREG_ISA_KNOWN_MASK = (1u << 12) - 1
};

/* Element types, as bits of a tensor's allowed set. */
enum {
  KREG_DTYPE_F32 = 1u << 0,
  KREG_DTYPE_BF16 = 1u << 1,
  KREG_DTYPE_I32 = 1u << 2
};

/* An attribute value: `i` for KREG_ATTR_INT, `f` for KREG_ATTR_FLOAT. */
typedef union kreg_scalar {
  int64_t i;
  double f;
} kreg_scalar;

/* ---- Ops ----------------------------------------------------------------- */

/* A named dimension of an op ("batch", "m", "k", "G"). */
typedef struct kreg_dim_desc {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+, unique within the op */
  const char* doc;  /* one line */
  int64_t max;      /* largest legal value; 0: INT64_MAX */
  /* Optional. The name of an earlier dim whose value this one takes when
   * the user gives it none (neither by name nor through an input's shape),
   * e.g. "local_groups" defaulting to "groups". NULL: the dim must be
   * given. */
  const char* default_dim;
  uint32_t flags; /* KREG_DIM_* */
  /* Optional: a derived dim, the value of earlier dim `numerator` divided by
   * earlier dim `denominator` (e.g. a shard's rows, "m" / "x"); the host
   * computes it and refuses a numerator the denominator does not divide.
   * Both NULL, or both set. */
  const char* numerator;
  const char* denominator;
  /* Optional: bytes the op's kernels may allocate per unit of this dim
   * beyond its tensors (per-group offsets, plans, task lists), which the
   * host counts with the tensors before allocating anything: a million
   * empty groups cost memory though no tensor grows. 0: none; >= 0. */
  int64_t bytes_per_unit;
} kreg_dim_desc;
/* kreg_dim_desc.flags */
#define KREG_DIM_RANKS 1u /* the communicator's size: the host sets it (a value
                             the user gives must equal it); an op with such a
                             dim is collective, its kernels run on every rank */
#define KREG_DIM_MESH_AXIS 2u /* the size of the device-mesh axis of the dim's
                                 name ("x"): the host sets it from the mesh;
                                 kreg_comm.axis(name) reaches that axis */
#define KREG_DIM_DESC_MIN_SIZE (offsetof(kreg_dim_desc, max) + sizeof(int64_t))

typedef enum kreg_role {
  KREG_ROLE_IN = 1,    /* read only */
  KREG_ROLE_OUT = 2,   /* written only; its prior contents are garbage */
  KREG_ROLE_INOUT = 3  /* read then written (e.g. an accumulator) */
} kreg_role;

/* How the host draws a tensor's random contents. */
typedef enum kreg_gen {
  KREG_GEN_VALUES = 0,      /* floats from the user's distribution; ints uniform */
  KREG_GEN_PARTITION = 1,   /* int32 [G] of sizes >= 0 summing to dim gen_dim
                               (balanced or skewed) */
  KREG_GEN_RANGE_START = 2, /* int32 [rows]: starts of ranges in [0, gen_dim) */
  KREG_GEN_RANGE_END = 3    /* int32 [rows]: ends >= the op's RANGE_START
                               tensor (0 if absent), <= gen_dim */
} kreg_gen;

/* How close an output must be to the reference's for one dtype:
 * |got - want| <= atol * scale + rtol * |want|, where scale is the value of
 * dim `scale_dim` (1 if NULL), e.g. the reduction length of a matmul. NaN
 * must meet NaN, an infinity the same infinity. A dtype without an entry is
 * compared bit for bit.
 * With KREG_TOLERANCE_MAGNITUDE (for ops that sum their float inputs), the
 * absolute term also scales with the size of the terms summed, M: the
 * reference's output on the inputs' absolute values; the bound becomes
 * atol * scale * max(1, M) + rtol * |want|, so a sum whose terms cancel is
 * held to the rounding of its terms rather than of its small result (a
 * float sum in another order can lose it all). Where M overflows the
 * output's dtype, any infinity or NaN is accepted too (float partial sums
 * may overflow, to one infinity or to both, where the reference's double
 * sum does not). With KREG_TOLERANCE_EXACT_NONFINITE as well (for ops whose
 * kernels recompute an output whose float sum came out NaN or infinite, in
 * double as the reference does), NaN and infinities must meet the
 * reference's there too: only finite outputs take the unbounded term.
 * With KREG_TOLERANCE_BF16_DAZ (for ops whose kernels may use the CPU's
 * bf16 dot-product instructions, AVX512_BF16 and AMX, which read bf16
 * subnormals as zero, as oneDNN on them does), an element is also accepted
 * where it is within the bound of the reference run on the inputs with
 * every bf16 subnormal set to zero (of its sign). */
typedef struct kreg_tolerance {
  size_t struct_size;
  uint32_t dtype; /* one KREG_DTYPE_* bit */
  double atol;
  double rtol;
  const char* scale_dim;
  uint32_t flags; /* KREG_TOLERANCE_* */
} kreg_tolerance;
#define KREG_TOLERANCE_MAGNITUDE 1u
#define KREG_TOLERANCE_BF16_DAZ 2u
#define KREG_TOLERANCE_EXACT_NONFINITE 4u
#define KREG_TOLERANCE_MIN_SIZE (offsetof(kreg_tolerance, scale_dim) + sizeof(const char*))

/* kreg_tensor_desc.flags */
#define KREG_TENSOR_OPTIONAL 1u  /* may be absent (NULL in kreg_args.tensors) */
#define KREG_TENSOR_UNCHECKED 2u /* an output each kernel fills as it documents
                                    (a statistic): never compared */

/* One tensor of an op. */
typedef struct kreg_tensor_desc {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+, unique within the op */
  const char* doc;  /* one line */
  uint32_t role;    /* kreg_role */
  uint32_t flags;   /* KREG_TENSOR_* */
  uint32_t dtypes;  /* allowed KREG_DTYPE_* bits */
  /* NULL, or the name of an earlier tensor whose dtype this one must have. */
  const char* same_dtype_as;
  /* Its shape as the op's dim names, comma-separated ("batch,n"; "" is a
   * scalar). The last dimension must be contiguous. */
  const char* shape;
  uint32_t gen;        /* kreg_gen, for inputs */
  const char* gen_dim; /* the dim PARTITION sums to / RANGE_* lie within */
  /* Outputs: per-dtype tolerances against the reference (none: exact). */
  const kreg_tolerance* const* tolerances;
  size_t num_tolerances;
  /* Optional: a second shape, in force whenever the INT attribute named
   * `alt_shape_attr` is non-zero in the call's args (e.g. "groups,n,k"
   * under "transpose_rhs"), written as `shape` is; everything the host
   * derives from a shape (checks, generated inputs, dims read from a
   * user's arrays, shape-only args) then uses it. Both NULL, or both set. */
  const char* alt_shape;
  const char* alt_shape_attr;
} kreg_tensor_desc;
#define KREG_TENSOR_DESC_MIN_SIZE (offsetof(kreg_tensor_desc, shape) + sizeof(const char*))

typedef enum kreg_attr_kind {
  KREG_ATTR_INT = 1,
  KREG_ATTR_FLOAT = 2
} kreg_attr_kind;

/* A scalar attribute of an op ("largest", "alpha"). */
typedef struct kreg_attr_desc {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+, unique within the op and apart from dims */
  const char* doc;  /* one line */
  uint32_t kind;    /* kreg_attr_kind */
  kreg_scalar default_value;
  kreg_scalar min, max; /* inclusive legal range, in the attribute's kind */
} kreg_attr_desc;
#define KREG_ATTR_DESC_MIN_SIZE (offsetof(kreg_attr_desc, max) + sizeof(kreg_scalar))

/* kreg_args.flags */
#define KREG_ARGS_SHAPE_ONLY 1u /* tensors carry shapes only: never read data */
/* The tensors are in kreg_host.device's memory (DLTensor.device kDLCUDA):
 * host-side code (validate, data_class, check) never reads their data; the
 * host validated the same call's data on the CPU before copying it over. */
#define KREG_ARGS_ON_DEVICE 2u

/* The arguments of one call of an op. See "Arguments" above. */
typedef struct kreg_args {
  size_t struct_size;
  uint32_t flags;
  DLTensor* const* tensors; /* num_tensors, in the op's order; inputs are read only */
  size_t num_tensors;
  const int64_t* dims; /* num_dims, in the op's order */
  size_t num_dims;
  const kreg_scalar* attrs; /* num_attrs, in the op's order */
  size_t num_attrs;
} kreg_args;
#define KREG_ARGS_MIN_SIZE (offsetof(kreg_args, num_attrs) + sizeof(size_t))

struct kreg_host;

/* An op: its dims, tensors and attributes, and what only it knows. */
typedef struct kreg_op_desc {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+ */
  const char* doc;  /* one line */
  const kreg_dim_desc* const* dims;
  size_t num_dims;
  const kreg_tensor_desc* const* tensors;
  size_t num_tensors;
  const kreg_attr_desc* const* attrs;
  size_t num_attrs;
  /* Semantic checks beyond shapes and dtypes (row ranges in bounds, group
   * sizes summing to at most m). May read data unless the args are
   * shape-only. May be NULL. */
  kreg_status (*validate)(const kreg_args* args, char* msg, size_t msg_cap);
  /* A feature of the data that changes which kernel wins (e.g. a group-size
   * skew bucket "skew=hot4"), written into `out` (a NUL-terminated
   * [a-z0-9_=.,-]* string, "" for none; out_cap is at least 64). Asked per
   * call at dispatch, and of generated inputs when tuning; never with
   * shape-only args. An error status fails the call. May be NULL. */
  kreg_status (*data_class)(const kreg_args* args, char* out, size_t out_cap);
  /* The variant to run when nothing is tuned (its default configuration),
   * given shape-only args and the host (machine, threads): a string in
   * static storage; NULL or an unknown name falls back to
   * `default_variants`. May be NULL. */
  const char* (*default_variant)(const kreg_args* args, const struct kreg_host* host);
  /* Variant names, most preferred first, for when nothing is tuned. */
  const char* const* default_variants;
  size_t num_default_variants;
} kreg_op_desc;
#define KREG_OP_DESC_MIN_SIZE (offsetof(kreg_op_desc, num_attrs) + sizeof(size_t))

/* ---- Parameters and configurations --------------------------------------- */

/* How a parameter's value is given. */
typedef enum kreg_param_kind {
  KREG_PARAM_INT = 1,      /* one of its values */
  KREG_PARAM_INT_LIST = 2, /* a list drawn from its values (strictly
                              increasing); the kernel's check says which
                              lists are legal */
  KREG_PARAM_CHOICE = 3    /* one of `choices`, passed as its index */
} kreg_param_kind;

/* Where an INT or INT_LIST parameter's values come from. */
typedef enum kreg_values_kind {
  KREG_VALUES_LISTED = 0, /* `values` */
  KREG_VALUES_RANGE = 1,  /* lo, lo + step, ... <= hi */
  KREG_VALUES_POW2 = 2    /* powers of two in [lo, hi] */
} kreg_values_kind;

/* One tunable parameter of a kernel. */
typedef struct kreg_param_desc {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+, unique within the kernel */
  const char* doc;  /* one line */
  uint32_t kind;    /* kreg_param_kind */
  const int64_t* values; /* LISTED: legal values / list elements */
  size_t num_values;
  const char* const* choices; /* CHOICE: the names */
  size_t num_choices;
  int64_t default_value;       /* INT: one of its values; CHOICE: an index */
  const int64_t* default_list; /* INT_LIST: the default list (may be empty) */
  size_t default_list_len;
  /* CHOICE: the ISA each choice needs (NULL: none). The host never
   * enumerates, defaults to or runs a choice the CPU lacks. */
  const uint32_t* choice_isa;
  /* Generated values instead of `values` (values_kind != LISTED): the range
   * [lo, hi] (RANGE: step >= 1), and for LISTED and generated values alike,
   * those above the value of dim `cap_dim` are not legal for that problem
   * (when no value is left, no configuration is legal; a default above the
   * cap is illegal there too, and the host moves on to another kernel). */
  uint32_t values_kind; /* kreg_values_kind */
  int64_t lo, hi, step;
  const char* cap_dim;
  /* Active only when parameter `when_param` (an earlier INT or CHOICE
   * parameter) holds one of `when_values` (choice indices for a CHOICE);
   * otherwise the parameter keeps its default and is not searched. NULL:
   * always active. */
  const char* when_param;
  const int64_t* when_values;
  size_t num_when_values;
} kreg_param_desc;
#define KREG_PARAM_DESC_MIN_SIZE (offsetof(kreg_param_desc, default_list_len) + sizeof(size_t))

/* The value of one parameter in a configuration. */
typedef struct kreg_param_value {
  size_t struct_size; /* the host fills these in */
  int64_t value;       /* INT: the value; CHOICE: the index */
  const int64_t* list; /* INT_LIST: the list */
  size_t list_len;
} kreg_param_value;

/* A configuration: one value per parameter, in the descriptor's order. */
typedef struct kreg_config {
  size_t struct_size;
  const kreg_param_value* const* values;
  size_t num_values;
} kreg_config;

/* ---- The host ------------------------------------------------------------ */

/* kreg_device.kind */
#define KREG_DEVICE_CUDA 1

/* A device the host owns through its device backend (a GPU): a kernel that
 * runs on it launches its work on `stream`, asynchronously, on tensors in
 * the device's memory (DLTensor.device kDLCUDA, ordinal `ordinal`); the
 * host synchronises and times around the run. NULL in kreg_host on the CPU. */
typedef struct kreg_device {
  size_t struct_size;
  void* ctx;          /* passed back to alloc and free */
  int32_t kind;       /* KREG_DEVICE_* */
  int32_t ordinal;    /* the device's index among its kind */
  void* stream;       /* CUDA: the cudaStream_t every launch goes on */
  int32_t sm;         /* CUDA: compute capability, major * 10 + minor (90: sm_90) */
  int32_t num_sms;    /* CUDA: multiprocessors */
  uint64_t memory_bytes;
  const char* name;   /* "NVIDIA H100 80GB HBM3" */
  /* Device memory (at least 256-byte aligned) for a kernel's own use, freed
   * with free(); NULL when out of memory. Stream-ordered: usable by work
   * launched on `stream` after the call. */
  void* (*alloc)(void* ctx, size_t bytes);
  void (*free)(void* ctx, void* p);
  /* CUDA: the CUDA version the driver supports (13000: 13.0). With name,
   * sm and memory_bytes, the GPU's identity in a table (kreg/lut.h
   * GpuMachine). */
  int32_t driver_version;
} kreg_device;

/* One rank's view of a communicator (collective ops; NCCL's net plugin
 * shape). Messages are point to point, matched by (source, tag) in the
 * order posted, as MPI's are; tags >= 0 are the kernel's, negative tags the
 * host's. A message must have the posted receive's size exactly: sizes that
 * disagree fail both sides with KREG_INVALID_ARGUMENT naming the ranks (the
 * ranks disagree on sizes or dtypes). A send's buffer must stay untouched,
 * and a receive's unread, until its request is done.
 * Requests: isend / irecv return one in *request; test() sets *done, and a
 * done request is finished; wait() finishes it whatever it returns. Every
 * request must be finished before the kernel returns (on error too: wait on
 * the ones posted; after a failure they return at once).
 * Waiting (wait, barrier, and test's bookkeeping) never spins a core for
 * long: a rank that waits sleeps. It gives up with KREG_UNAVAILABLE when a
 * peer has failed or nothing has arrived within the communicator's timeout,
 * and with KREG_CANCELLED when the host's cancelled() says stop; the
 * message names the peer and what was awaited. */
typedef struct kreg_comm {
  size_t struct_size;
  void* ctx; /* passed back to every function below */
  int32_t rank, size;
  kreg_status (*isend)(void* ctx, int32_t peer, int32_t tag, const void* buf, size_t bytes, void** request,
                       char* msg, size_t msg_cap);
  kreg_status (*irecv)(void* ctx, int32_t peer, int32_t tag, void* buf, size_t bytes, void** request,
                       char* msg, size_t msg_cap);
  kreg_status (*test)(void* ctx, void* request, int* done, char* msg, size_t msg_cap);
  kreg_status (*wait)(void* ctx, void* request, char* msg, size_t msg_cap);
  kreg_status (*barrier)(void* ctx, char* msg, size_t msg_cap);
  /* Optional (read with KREG_HAS_FIELD): this rank's communicator along
   * mesh axis `name`, the ranks that share every other mesh coordinate,
   * ranked by their coordinate on that axis; NULL when the communicator is
   * not a mesh or has no such axis. Valid as long as this one. A mesh's
   * ranks are numbered row-major: the first axis varies slowest. */
  const struct kreg_comm* (*axis)(void* ctx, const char* name);
  /* Optional (read with KREG_HAS_FIELD; NULL: irecv into a buffer of the
   * kernel's, then consume it there): a receive of `bytes` from `peer`
   * that hands the message to `consume` instead of copying it into a
   * buffer. consume(arg, data, bytes) runs exactly once, before the
   * request is done, with the message at `data`, readable only during the
   * call; it may run on any thread (the receiving rank's, the sending
   * rank's or the backend's), so it may write only memory this rank leaves
   * alone until the request is done. Over thread ranks `data` is the
   * sender's own buffer, so a kernel reduces straight from it without a
   * staging copy. Sizes that disagree fail both sides as for irecv, and a
   * request that fails (or is withdrawn) never calls consume. */
  kreg_status (*irecv_consume)(void* ctx, int32_t peer, int32_t tag, size_t bytes,
                               void (*consume)(void* arg, const void* data, size_t bytes), void* arg,
                               void** request, char* msg, size_t msg_cap);
} kreg_comm;
#define KREG_COMM_MIN_SIZE (offsetof(kreg_comm, barrier) + sizeof(void*))

/* The α-β-γ costs of a communicator backend (Thakur, Rabenseifner and Gropp
 * 2005), as `kreg calibrate` measured them: a message costs alpha + bytes *
 * beta seconds, reducing costs gamma seconds per byte. */
typedef struct kreg_comm_model {
  size_t struct_size;
  double alpha; /* seconds per message */
  double beta;  /* seconds per byte sent */
  double gamma; /* seconds per byte reduced */
} kreg_comm_model;

/* What only the host owns. Any function pointer may be NULL. */
typedef struct kreg_host {
  size_t struct_size;
  void* ctx;           /* passed back to every function below */
  int32_t num_threads; /* 0: the host's default */
  uint32_t isa;        /* KREG_ISA_* bits of this CPU (as the host sees it) */
  int (*cancelled)(void* ctx); /* non-zero: stop and return KREG_CANCELLED */
  void (*log)(void* ctx, int level, const char* message); /* 0 info, 1 warning */
  /* Aligned memory (alignment a power of two); NULL when out of memory. */
  void* (*alloc)(void* ctx, size_t bytes, size_t alignment);
  void (*free)(void* ctx, void* p);
  /* Runs op `op` on `args` with whatever the host's tuning table picks
   * (composite ops). */
  kreg_status (*dispatch)(void* ctx, const char* op, const kreg_args* args, char* msg,
                          size_t msg_cap);
  const kreg_comm* comm;            /* this rank's; NULL outside collectives */
  const struct kreg_device* device; /* NULL on the CPU */
  /* A collective's backend costs, when calibrated: an op's default_variant
   * may choose by them. NULL otherwise. */
  const kreg_comm_model* comm_model;
} kreg_host;
#define KREG_HOST_MIN_SIZE (offsetof(kreg_host, isa) + sizeof(uint32_t))

/* ---- Kernels and plugins -------------------------------------------------- */

/* kreg_kernel.flags */
#define KREG_KERNEL_REFERENCE 1u /* the op's oracle: plain, obviously right */

/* One kernel variant of an op. */
typedef struct kreg_kernel {
  size_t struct_size;
  const char* op;        /* e.g. "topk" */
  const char* variant;   /* e.g. "radix"; registered as op/variant */
  uint32_t version;      /* >= 1 */
  const char* doc;       /* one line */
  uint32_t required_isa; /* KREG_ISA_* bits */
  uint32_t flags;        /* KREG_KERNEL_* */
  const kreg_param_desc* const* params;
  size_t num_params;
  /* Is `config` legal for `args`? KREG_INVALID_ARGUMENT with a reason if
   * not. Sees shapes only (args may be shape-only). */
  kreg_status (*check)(const kreg_config* config, const kreg_args* args, const kreg_host* host,
                       char* msg, size_t msg_cap);
  /* Scratch memory `run` needs. Sees shapes only. */
  kreg_status (*workspace_bytes)(const kreg_config* config, const kreg_args* args,
                                 const kreg_host* host, size_t* bytes, char* msg, size_t msg_cap);
  /* Compute. `state` is what prepare made (NULL without prepare);
   * `workspace` has at least workspace_bytes() bytes, 64-byte aligned,
   * uninitialised (NULL when zero bytes). */
  kreg_status (*run)(const kreg_config* config, const kreg_args* args, void* state, void* workspace,
                     size_t workspace_size, const kreg_host* host, char* msg, size_t msg_cap);
  /* Per-problem state (packed weights, a plan), built outside the timed run;
   * *state may be left NULL. */
  kreg_status (*prepare)(const kreg_config* config, const kreg_args* args, const kreg_host* host,
                         void** state, char* msg, size_t msg_cap);
  void (*release)(void* state);
  /* Where the kernel runs: 0 the CPU; KREG_DEVICE_CUDA a CUDA device, on
   * args flagged KREG_ARGS_ON_DEVICE, launching on kreg_host.device's
   * stream (the host synchronises). */
  uint32_t device;
} kreg_kernel;
#define KREG_KERNEL_MIN_SIZE (offsetof(kreg_kernel, run) + sizeof(void*))

typedef struct kreg_plugin {
  size_t struct_size;
  uint32_t abi_version; /* KREG_ABI_VERSION the plugin was built against */
  const char* name;     /* e.g. "topk" */
  const char* version;  /* the plugin's own version string */
  const kreg_op_desc* const* ops;
  size_t num_ops;
  const kreg_kernel* const* kernels;
  size_t num_kernels;
  /* Once after loading, before anything else; an error refuses the plugin. */
  kreg_status (*init)(const kreg_host* host, char* msg, size_t msg_cap);
  /* Once before unloading. */
  void (*fini)(void);
} kreg_plugin;
#define KREG_PLUGIN_MIN_SIZE (offsetof(kreg_plugin, num_kernels) + sizeof(size_t))

typedef const kreg_plugin* (*kreg_plugin_entry)(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KREG_PLUGIN_ABI_H_ */
