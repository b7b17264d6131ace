// gmm/tiled and tgmm/tiled: cache-blocked grouped matmuls on oneTBB.
//
// Both ops are a list of products, one per local group: C[M x N] = A[M x K]
// . B[K x N] (gmm: A = the group's rows of lhs, K = k, B = rhs[g]; tgmm: A =
// lhs[:, the group's rows], K = the group's size, B = those rows of rhs).
// Each product is cut into tasks of at most tm rows x tn columns, all of K;
// the tasks of all groups form one list, largest first, which oneTBB
// threads take from, so a hot group is spread over every thread and many
// tiny groups over few: the split follows flops, not groups. A task walks K
// in slices of tk: it packs the slice of B (strips of nr columns,
// zero-padded; the next slice prefetched meanwhile) into a thread-local
// buffer, and runs the micro-kernel panel (micro.h) over blocks of the
// task's rows into a float accumulator. Where B is f32 rhs as it lies and
// every strip is whole, the panel packs it instead (PanelArgs::b_src): each
// strip's first register block reads it in place and writes the packed
// copy that the strip's other blocks read, with no pass of its own. On the
// last slice the micro-kernel stores the sums straight to out, rounded to out's dtype (PanelOut: their
// stores overlap the FMAs, where a copy after the task ran alone: skewed
// tgmm writes 512 MiB a call); with existing_out, a strip that n cuts or
// the amx set the task stores the accumulator once instead (existing_out
// added, one rounding to out's dtype). gmm reads A in place (f32 for the
// f32 kernels; bf16 for the pair kernels, but for a slice of odd length,
// copied with a pad); tgmm, whose A rows lie far apart, copies it into a
// padded buffer; bf16 A is widened for the f32 kernels. A product with several
// row tasks keeps B's whole packed column panel per thread, so a thread's
// next task of that panel packs nothing. A group may start anywhere and its
// last tile may be partial; k and n need not divide the tiles.
//
// Constant weights (gmm, attribute constant_weights=1): prepare packs every
// local group's rhs once, in the layout the tasks read, and run skips B's
// packing. The state is valid for any group_sizes, so one prepare serves an
// inference model's every batch.
//
// Accuracy. Accumulation is in float, within the op's tolerance of the
// reference's double sums for data of sane magnitude (as any BLAS). Where an
// input is NaN or infinite, or a float product or sum overflows, the float
// accumulator is NaN or infinite (an infinity never vanishes from a float
// sum: it stays, or meets its opposite and becomes NaN); every such output is
// recomputed in double in the reference's order, so NaN and infinities come
// out exactly as the reference's and no overflow happens that double would
// not have. No pass over the inputs is needed for this.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <emmintrin.h>
#include <immintrin.h>
#include <xmmintrin.h>

#include <oneapi/tbb/enumerable_thread_specific.h>

#include "bf16_round.h"
#include "common.h"
#include "micro.h"
#include "variants.h"

namespace kreg::gmm {
namespace {

// ---- Parameters ------------------------------------------------------------------

enum { kParamTm = 0, kParamTn, kParamTk, kParamMr, kParamMicro, kNumParams };

const int64_t kTmValues[] = {96, 192, 384};
const int64_t kTnValues[] = {256, 512};
const int64_t kTkValues[] = {128, 256};
const int64_t kMrValues[] = {4, 6, 8, 12};
const MicroSet* const kMicros[] = {&kMicroGeneric, &kMicroAvx2, &kMicroAvx512, &kMicroAvx512Bf16, &kMicroAmxBf16};
const char* const kMicroChoices[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
constexpr uint32_t kAvx512Isa =
    KREG_ISA_AVX2 | KREG_ISA_FMA | KREG_ISA_AVX512F | KREG_ISA_AVX512BW | KREG_ISA_AVX512VL | KREG_ISA_AVX512DQ;
const uint32_t kMicroIsa[] = {0, KREG_ISA_AVX2 | KREG_ISA_FMA, kAvx512Isa, kAvx512Isa | KREG_ISA_AVX512BF16,
                               kAvx512Isa | KREG_ISA_AVX512BF16 | KREG_ISA_AMX_TILE | KREG_ISA_AMX_BF16};
constexpr int kNumMicros = sizeof kMicros / sizeof kMicros[0];
constexpr int kMicroAvx2Choice = 1;

const kreg_param_desc kTmParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tm",
    .doc = "rows per task, which share one packed B slice (gmm: of a group's rows; tgmm: of out[g]'s k rows)",
    .kind = KREG_PARAM_INT,
    .values = kTmValues,
    .num_values = 3,
    .default_value = 192,
};
const kreg_param_desc kTnParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tn",
    .doc = "columns per task (the width of a packed B panel)",
    .kind = KREG_PARAM_INT,
    .values = kTnValues,
    .num_values = 2,
    .default_value = 256,
};
const kreg_param_desc kTkParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "tk",
    .doc = "reduction slice packed at a time (gmm: of k; tgmm: of a group's rows)",
    .kind = KREG_PARAM_INT,
    .values = kTkValues,
    .num_values = 2,
    .default_value = 128,
};
const kreg_param_desc kMrParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "mr",
    .doc = "rows of the micro-kernel's register block (8 and 12 need an avx512 micro-kernel; amx uses it past its tiles)",
    .kind = KREG_PARAM_INT,
    .values = kMrValues,
    .num_values = 4,
    .default_value = 6,
};
const kreg_param_desc kMicroParam = {
    .struct_size = sizeof(kreg_param_desc),
    .name = "micro",
    .doc = "micro-kernel: portable C++, AVX2+FMA, AVX-512 f32, or for bf16 inputs AVX512_BF16 pair dot products or AMX-BF16 tiles",
    .kind = KREG_PARAM_CHOICE,
    .choices = kMicroChoices,
    .num_choices = kNumMicros,
    .default_value = kMicroAvx2Choice,
    .choice_isa = kMicroIsa,
};
const kreg_param_desc* const kParams[] = {&kTmParam, &kTnParam, &kTkParam, &kMrParam, &kMicroParam};

struct Tiling {
  int64_t tm = 0, tn = 0, tk = 0;
  int mr = 0;
  const MicroSet* micro = nullptr;
};

kreg_status ReadConfig(const kreg_config* config, bool bf16_inputs, Tiling* t, char* msg, size_t cap) {
  if (config == nullptr || config->num_values < kNumParams || config->values == nullptr) {
    return Fail(KREG_INVALID_ARGUMENT, msg, cap, "tiled: expected 5 parameter values (tm, tn, tk, mr, micro)");
  }
  for (int i = 0; i < kNumParams; ++i) {
    if (config->values[i] == nullptr) return Fail(KREG_INVALID_ARGUMENT, msg, cap, "tiled: a parameter value is NULL");
  }
  t->tm = config->values[kParamTm]->value;
  t->tn = config->values[kParamTn]->value;
  t->tk = config->values[kParamTk]->value;
  const int64_t mr = config->values[kParamMr]->value;
  const int64_t micro = config->values[kParamMicro]->value;
  if (micro < 0 || micro >= kNumMicros || t->tm < 1 || t->tm > 4096 || t->tn < 1 || t->tn > 4096 || t->tk < 2 ||
      t->tk > 4096 || t->tk % 2 != 0 || (mr != 4 && mr != 6 && mr != 8 && mr != 12)) {
    std::snprintf(msg, cap, "tiled: illegal config tm=%lld tn=%lld tk=%lld mr=%lld micro=%lld",
                  static_cast<long long>(t->tm), static_cast<long long>(t->tn), static_cast<long long>(t->tk),
                  static_cast<long long>(mr), static_cast<long long>(micro));
    return KREG_INVALID_ARGUMENT;
  }
  t->micro = kMicros[micro];
  t->mr = static_cast<int>(mr);
  if (t->mr > t->micro->max_mr) {
    std::snprintf(msg, cap, "tiled: mr=%d does not fit micro=%s's registers (at most %d rows)", t->mr,
                  t->micro->name, t->micro->max_mr);
    return KREG_INVALID_ARGUMENT;
  }
  if (t->tn % t->micro->nr != 0) {
    std::snprintf(msg, cap, "tiled: tn=%lld is not a multiple of micro=%s's %d columns", static_cast<long long>(t->tn),
                  t->micro->name, t->micro->nr);
    return KREG_INVALID_ARGUMENT;
  }
  if (t->micro->bf16_pairs && !bf16_inputs) {
    std::snprintf(msg, cap, "tiled: micro=%s takes bf16 inputs only", t->micro->name);
    return KREG_INVALID_ARGUMENT;
  }
  return KREG_OK;
}

// ---- Products and packing ---------------------------------------------------------

// A matrix of f32 or bf16: element (r, c) at p + r * ld + c, or, transposed,
// at p + c * ld + r.
struct Src {
  const void* p = nullptr;
  int64_t ld = 0;
  bool bf16 = false, trans = false;
};

// One group's C[rows x n] = A[rows x depth] . B[depth x n].
struct Product {
  int64_t rows = 0, depth = 0;
  Src a, b;
  int64_t local = 0;  // local group index (prepacked weights)
  int64_t first = 0;  // gmm: first output row; tgmm: unused
  // Copy A (f32, or bf16 for the pair kernels) into the task's padded
  // buffer rather than read it in place: tgmm's A rows lie m elements
  // apart (16 KiB for f32, m = 4096), so a block's rows fall into the same
  // few L1 sets and evict one another between the B strips that reread
  // them; copied, they are lda apart (padded).
  bool pack_a = false;
};

// Rows [i0, i0 + rows) x reduction [p0, p0 + kc) of A into dst (row stride
// ld): f32 (bf16 widened), or raw bf16 with a zero pad to an even length for
// the pair kernels.
void PackA(const Src& a, int64_t i0, int64_t rows, int64_t p0, int64_t kc, bool pairs, void* dst, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) {
    const void* src = Advance(a.p, a.bf16, (i0 + i) * a.ld + p0);
    if (pairs) {
      uint16_t* d = static_cast<uint16_t*>(dst) + i * ld;
      std::memcpy(d, src, kc * sizeof(uint16_t));
      if (kc % 2 != 0) d[kc] = 0;
    } else if (a.bf16) {
      const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
      uint32_t* __restrict d = static_cast<uint32_t*>(dst) + i * ld;
      for (int64_t p = 0; p < kc; ++p) d[p] = static_cast<uint32_t>(s[p]) << 16;
    } else {
      std::memcpy(static_cast<uint32_t*>(dst) + i * ld, src, kc * sizeof(uint32_t));
    }
  }
}

// Element (r, c) of B as the bits of the packed element type.
inline uint32_t BitsF32(const Src& b, int64_t r, int64_t c) {
  const int64_t at = b.trans ? c * b.ld + r : r * b.ld + c;
  return b.bf16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(b.p)[at]) << 16
                : static_cast<const uint32_t*>(b.p)[at];
}

// Reduction [p0, p0 + kc) x columns [c0, c0 + cols) of B into strips of nr
// columns, zero-padded: f32, strip s element (p, j) at
// s * kc * nr + p * nr + j; or bf16 pairs, (q, j, e) at
// s * kcp * nr + (q * nr + j) * 2 + e with kcp = kc rounded up to even.
void PackB(const Src& b, int64_t p0, int64_t kc, int64_t c0, int64_t cols, int nr, bool pairs, void* dst) {
  const int64_t strips = (cols + nr - 1) / nr;
  // Rows of B are contiguous unless transposed: row by row (a page each
  // when n is large), the rows ahead prefetched.
  constexpr int64_t kAhead = 4;
  const int64_t elem = b.bf16 ? 2 : 4;
  auto prefetch_row = [&](int64_t p) {
    if (p >= kc) return;
    const char* ahead = static_cast<const char*>(b.p) + ((p0 + p) * b.ld + c0) * elem;
    for (int64_t off = 0; off < cols * elem; off += 64) __builtin_prefetch(ahead + off);
  };
  if (pairs) {
    const int64_t kcp = kc + kc % 2;
    const uint16_t* src = static_cast<const uint16_t*>(b.p);
    uint16_t* d = static_cast<uint16_t*>(dst);
    if (!b.trans) {
      // Two rows at a time, interleaved (the pad row past an odd kc is 0).
      for (int64_t p = 0; p < kcp; p += 2) {
        prefetch_row(p + kAhead);
        prefetch_row(p + kAhead + 1);
        const uint16_t* r0 = src + (p0 + p) * b.ld + c0;
        const uint16_t* r1 = p + 1 < kc ? r0 + b.ld : nullptr;
        for (int64_t s = 0; s < strips; ++s) {
          uint16_t* __restrict out = d + s * kcp * nr + p * nr;
          const uint16_t* __restrict x = r0 + s * nr;
          const int64_t width = std::min<int64_t>(nr, cols - s * nr);
          if (r1 != nullptr) {
            const uint16_t* __restrict y = r1 + s * nr;
            for (int64_t j = 0; j < width; ++j) {
              out[2 * j] = x[j];
              out[2 * j + 1] = y[j];
            }
          } else {
            for (int64_t j = 0; j < width; ++j) {
              out[2 * j] = x[j];
              out[2 * j + 1] = 0;
            }
          }
          std::fill(out + 2 * width, out + 2 * nr, uint16_t{0});
        }
      }
      return;
    }
    // Transposed: column c of B is a contiguous row of the source, so each
    // pair is two adjacent elements there.
    for (int64_t s = 0; s < strips; ++s) {
      for (int64_t j = 0; j < nr; ++j) {
        const int64_t c = s * nr + j;
        uint16_t* out = d + s * kcp * nr + 2 * j;
        const uint16_t* col = src + (c0 + c) * b.ld + p0;
        for (int64_t p = 0; p < kcp; p += 2) {
          out[p * nr] = c < cols ? col[p] : 0;
          out[p * nr + 1] = c < cols && p + 1 < kc ? col[p + 1] : 0;
        }
      }
    }
    return;
  }
  uint32_t* d = static_cast<uint32_t*>(dst);
  if (!b.trans) {
    for (int64_t p = 0; p < kc; ++p) {
      prefetch_row(p + kAhead);
      for (int64_t s = 0; s < strips; ++s) {
        uint32_t* __restrict out = d + s * kc * nr + p * nr;
        const int64_t width = std::min<int64_t>(nr, cols - s * nr);
        if (b.bf16) {
          const uint16_t* __restrict in = static_cast<const uint16_t*>(b.p) + (p0 + p) * b.ld + c0 + s * nr;
          for (int64_t j = 0; j < width; ++j) out[j] = static_cast<uint32_t>(in[j]) << 16;
        } else {
          // A strip row is 64 or 128 bytes: copies of a constant size are
          // inlined (a call per strip row was a tenth of skewed gmm's time).
          const uint32_t* in = static_cast<const uint32_t*>(b.p) + (p0 + p) * b.ld + c0 + s * nr;
          if (width == 16) {
            std::memcpy(out, in, 16 * 4);
          } else if (width == 32) {
            std::memcpy(out, in, 32 * 4);
          } else {
            std::memcpy(out, in, width * 4);
          }
        }
        for (int64_t j = width; j < nr; ++j) out[j] = 0;
      }
    }
    return;
  }
  // Transposed: each column of B is a contiguous row of the source.
  for (int64_t s = 0; s < strips; ++s) {
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t c = s * nr + j;
      uint32_t* out = d + s * kc * nr + j;
      for (int64_t p = 0; p < kc; ++p) out[p * nr] = c < cols ? BitsF32(b, p0 + p, c0 + c) : 0;
    }
  }
}

// Packed elements of one B slice of kc rows and one full-width strip set.
inline int64_t PackedKc(int64_t kc, bool pairs) { return pairs ? kc + kc % 2 : kc; }
inline int ElemBytes(bool pairs) { return pairs ? 2 : 4; }

// Every local group's rhs packed for one tiling (constant weights).
struct PackedWeights {
  Tiling t;
  int64_t depth = 0, n_pad = 0;
  std::vector<std::unique_ptr<char[]>> groups;  // per local group

  // The packed slice [p0, p0 + tk) x strips from column c0 of group g.
  const void* Slice(int64_t g, int64_t p0, int64_t c0) const {
    const bool pairs = t.micro->bf16_pairs;
    const int64_t kc = std::min(t.tk, depth - p0);
    const int64_t elems = p0 * n_pad + (c0 / t.micro->nr) * PackedKc(kc, pairs) * t.micro->nr;
    return groups[g].get() + elems * ElemBytes(pairs);
  }
};

// Thread-local scratch, grown as needed.
struct Scratch {
  std::vector<float> a, b, c;  // float-sized slots; pair kernels use them as bf16
  // A product with several row tasks keeps B's whole packed column panel
  // (every slice) here, so the thread's next task of the same product and
  // columns packs nothing.
  std::vector<float> panel;
  int64_t panel_product = -1, panel_c0 = -1;
};

// Rows of A taken at a time within a task (a multiple of every mr): with a
// tk slice they stay in L2 beside B's slice.
constexpr int64_t kBlockRows = 96;

struct Task {
  int64_t product, r0, rows, c0, cols;
};

// Runs every product's tasks. target(pr, task) says where in out the
// task's sums may go straight from the micro-kernel (PanelOut at the
// task's corner; p null where they may not: existing_out);
// store(pr, task, c, ldc) writes the task's accumulator (rows x cols, row
// stride ldc) to out otherwise, and with c null recomputes the non-finite
// sums already there.
template <typename Target, typename Store>
kreg_status RunProducts(const std::vector<Product>& products, int64_t n, const Tiling& t, const PackedWeights* packed,
                        const kreg_host* host, Target&& target, Store&& store) {
  std::vector<Task> tasks;
  for (int64_t x = 0; x < static_cast<int64_t>(products.size()); ++x) {
    for (int64_t r0 = 0; r0 < products[x].rows; r0 += t.tm) {
      for (int64_t c0 = 0; c0 < n; c0 += t.tn) {
        tasks.push_back({x, r0, std::min(t.tm, products[x].rows - r0), c0, std::min(t.tn, n - c0)});
      }
    }
  }
  // Largest first: the hot groups' tasks spread over the threads early.
  // The largest products first (their tasks spread over the threads
  // early); a product's tasks by column block, then rows, so a thread taking
  // a run of them packs each B panel once (see Scratch::panel).
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& x, const Task& y) {
    const int64_t fx = products[x.product].rows * products[x.product].depth;
    const int64_t fy = products[y.product].rows * products[y.product].depth;
    if (fx != fy) return fx > fy;
    if (x.product != y.product) return x.product < y.product;
    return x.c0 != y.c0 ? x.c0 < y.c0 : x.r0 < y.r0;
  });
  const MicroSet& micro = *t.micro;
  const bool pairs = micro.bf16_pairs;
  const int nr = micro.nr;
  tbb::enumerable_thread_specific<Scratch> scratch;
  return ParallelFor(static_cast<int64_t>(tasks.size()), host, [&](int64_t index) {
    const Task& task = tasks[index];
    const Product& pr = products[task.product];
    Scratch& s = scratch.local();
    const int64_t strips = (task.cols + nr - 1) / nr;
    const int64_t ldc = strips * nr;
    const int64_t block = std::min(kBlockRows, task.rows);
    const int64_t kcp = PackedKc(t.tk, pairs);
    const int64_t lda = kcp + (pairs ? 32 : 16);  // padded: rows do not alias in L1
    // A is read in place where its rows, contiguous along the reduction,
    // are what the micro-kernel reads: f32 for f32 kernels, bf16 for the
    // pair kernels in a slice of even length; not for tgmm (Product::pack_a).
    // Otherwise bf16 is widened, or copied with a zero pad past an odd slice
    // for the pair kernels.
    s.c.resize(task.rows * ldc);
    if (pr.a.bf16 || pr.pack_a) s.a.resize(block * lda);
    // Several row tasks share this product's B: pack its whole column panel
    // once per thread (slice p0 at p0 * ldc elements).
    const bool whole = packed == nullptr && pr.rows > t.tm;
    const bool reuse = whole && s.panel_product == task.product && s.panel_c0 == task.c0;
    if (whole && !reuse) {
      s.panel_product = -1;
      s.panel.resize((PackedKc(pr.depth, pairs) * ldc * ElemBytes(pairs) + 3) / 4);
    }
    if (!whole) s.b.resize(kcp * ldc);
    if (pr.depth == 0) std::fill(s.c.begin(), s.c.end(), 0.0f);
    // The last slice's sums straight to out, where the set and the op
    // allow it and every strip is whole: their stores overlap the FMAs,
    // where a copy after the task ran alone (skewed tgmm's 512 MiB out).
    PanelOut direct;
    bool wild = false;
    if (micro.stores_out && pr.depth > 0 && task.cols % nr == 0) direct = target(pr, task);
    if (direct.p != nullptr) {
      direct.wild = &wild;
      direct.stream = direct.stream && reinterpret_cast<uintptr_t>(direct.p) % 64 == 0 &&
                      direct.ld * (direct.bf16 ? 2 : 4) % 64 == 0;
    }
    // Per slice of the reduction: B's slice packed once (it stays in L2),
    // then every block of the task's rows against it.
    for (int64_t p0 = 0; p0 < pr.depth; p0 += t.tk) {
      const int64_t kc = std::min(t.tk, pr.depth - p0);
      void* b = s.b.data();
      if (packed != nullptr) {
        b = const_cast<void*>(packed->Slice(pr.local, p0, task.c0));
      } else if (whole) {
        b = reinterpret_cast<char*>(s.panel.data()) + p0 * ldc * ElemBytes(pairs);
      }
      const bool pack = packed == nullptr && !reuse;
      // f32 strips of rhs, every one whole, are packed by the panel's
      // first register blocks as they use them (PanelArgs::b_src).
      const bool pack_in_panel = pack && !pairs && !pr.b.bf16 && !pr.b.trans && task.cols % nr == 0;
      if (pack && !pack_in_panel) PackB(pr.b, p0, kc, task.c0, task.cols, nr, pairs, b);
      // The next slice of B is fetched from memory while this one computes
      // (spread over the first row block's panel).
      const int64_t next = p0 + t.tk;
      const bool fetch_next = pack && next < pr.depth && !pr.b.trans;
      const bool direct_a = pairs ? kc % 2 == 0 && !pr.pack_a : !pr.a.bf16 && !pr.pack_a;
      const bool last = p0 + kc == pr.depth;
      for (int64_t i0 = 0; i0 < task.rows; i0 += block) {
        const int64_t rows = std::min(block, task.rows - i0);
        PanelArgs args;
        args.mr = t.mr;
        if (direct_a) {
          args.a = Advance(pr.a.p, pr.a.bf16, (task.r0 + i0) * pr.a.ld + p0);
          args.lda = pr.a.ld;
        } else {
          PackA(pr.a, task.r0 + i0, rows, p0, kc, pairs, s.a.data(), lda * (pairs ? 2 : 1));
          args.a = s.a.data();
          args.lda = lda * (pairs ? 2 : 1);
        }
        args.rows = rows;
        args.b = b;
        args.kc = PackedKc(kc, pairs);
        args.strips = strips;
        args.c = s.c.data() + i0 * ldc;
        args.ldc = ldc;
        args.accumulate = p0 > 0;
        if (fetch_next && i0 == 0) {
          const int elem = pr.b.bf16 ? 2 : 4;
          args.prefetch = static_cast<const char*>(pr.b.p) + (next * pr.b.ld + task.c0) * elem;
          args.prefetch_rows = std::min(t.tk, pr.depth - next);
          args.prefetch_row_bytes = task.cols * elem;
          args.prefetch_ld = pr.b.ld * elem;
        }
        if (pack_in_panel && i0 == 0) {
          args.b_src = static_cast<const float*>(pr.b.p) + p0 * pr.b.ld + task.c0;
          args.b_src_ld = pr.b.ld;
        }
        if (last && direct.p != nullptr) {
          args.out = direct;
          args.out.p = Advance(direct.p, direct.bf16, i0 * direct.ld);
        }
        micro.panel(args);
      }
    }
    if (whole) {
      s.panel_product = task.product;
      s.panel_c0 = task.c0;
    }
    if (direct.p == nullptr) return store(pr, task, s.c.data(), ldc);
    if (direct.stream) _mm_sfence();  // the streamed sums before the task counts as done
    if (wild) store(pr, task, nullptr, 0);
  });
}

// Whether an output of `bytes` is written with non-temporal stores: when it
// is larger than a last-level cache it would only evict (tgmm's 512 MiB out
// on a 32 MiB L3: 10-20% of the call saved on a Zen 4); a smaller one stays
// in cache for whoever reads it next. A fixed size, not the cache's: under
// a VM the reported L3 is often the host's (320 MiB on that Zen 4).
constexpr int64_t kStreamOutBytes = int64_t{64} << 20;

// Copies n floats of c to o (non-temporal stores where `stream` and o is
// 16-byte aligned) and says whether any was non-finite: one pass over the
// accumulator, where a copy and a separate check took two.
inline bool CopyF32Row(float* o, const float* c, int64_t n, bool stream) {
  const __m128i exponent = _mm_set1_epi32(0x7f800000);
  __m128i bad = _mm_setzero_si128();
  int64_t j = 0;
  if (stream && reinterpret_cast<uintptr_t>(o) % 16 == 0) {
    for (; j + 4 <= n; j += 4) {
      const __m128 x = _mm_loadu_ps(c + j);
      bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(x), exponent), exponent));
      _mm_stream_ps(o + j, x);
    }
  } else {
    for (; j + 4 <= n; j += 4) {
      const __m128 x = _mm_loadu_ps(c + j);
      bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(x), exponent), exponent));
      _mm_storeu_ps(o + j, x);
    }
  }
  bool tail = false;
  for (; j < n; ++j) {
    o[j] = c[j];
    tail |= !std::isfinite(c[j]);
  }
  return tail || _mm_movemask_epi8(bad) != 0;
}

// Sixteen bf16 to o, around the cache where `stream` and o is on 32 bytes.
__attribute__((target("avx2"))) inline void StoreBf16x16(uint16_t* o, __m256i bits, bool stream) {
  __m256i* to = reinterpret_cast<__m256i*>(o);
  if (stream && reinterpret_cast<uintptr_t>(to) % 32 == 0) {
    _mm256_stream_si256(to, bits);
  } else {
    _mm256_storeu_si256(to, bits);
  }
}

// CopyBf16Row's loop on AVX-512 (sixteen at a time); returns where it
// stopped and ors into *bad whether a float was not finite.
__attribute__((target("avx512f"))) int64_t CopyBf16Row512(uint16_t* o, const float* c, int64_t n, bool stream,
                                                          bool* bad) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __mmask16 wild = 0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(c + j));
    wild |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exponent), exponent);
    StoreBf16x16(o + j, Bf16Bits512(u), stream);
  }
  *bad |= wild != 0;
  return j;
}

// CopyBf16Row512's loop on AVX2, sixteen at a time.
__attribute__((target("avx2"))) int64_t CopyBf16Row256(uint16_t* o, const float* c, int64_t n, bool stream,
                                                       bool* bad) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256i wild = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256i lo = _mm256_castps_si256(_mm256_loadu_ps(c + j));
    const __m256i hi = _mm256_castps_si256(_mm256_loadu_ps(c + j + 8));
    wild = _mm256_or_si256(wild, _mm256_cmpeq_epi32(_mm256_and_si256(lo, exponent), exponent));
    wild = _mm256_or_si256(wild, _mm256_cmpeq_epi32(_mm256_and_si256(hi, exponent), exponent));
    StoreBf16x16(o + j, Bf16Bits256x2(lo, hi), stream);
  }
  *bad |= !_mm256_testz_si256(wild, wild);
  return j;
}

// CopyF32Row for a bf16 out: n floats of c rounded to bf16 (FloatToBf16's
// rounding; sixteen at a time on AVX-512 or AVX2 as `isa` has them, else
// eight in SSE2) into o. Rounded one element at a time, a bf16 out took
// longer than an f32 one on skewed tgmm (the whole call 104-116 against
// 79-86 ms; SSE2 87, AVX-512 74 ms).
inline bool CopyBf16Row(uint16_t* o, const float* c, int64_t n, bool stream, uint32_t isa) {
  bool wide_bad = false;
  const int64_t done = (isa & KREG_ISA_AVX512F) != 0 ? CopyBf16Row512(o, c, n, stream, &wide_bad)
                       : (isa & KREG_ISA_AVX2) != 0  ? CopyBf16Row256(o, c, n, stream, &wide_bad)
                                                     : 0;
  o += done;
  c += done;
  n -= done;
  const __m128i exponent = _mm_set1_epi32(0x7f800000);
  const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
  const __m128i round = _mm_set1_epi32(0x7fff);
  const __m128i one = _mm_set1_epi32(1);
  const __m128i quiet = _mm_set1_epi32(0x400000);
  __m128i bad = _mm_setzero_si128();
  // Four floats to their bf16 bits, each in the low half of a lane,
  // sign-extended (so that the pack below keeps every bit).
  auto to_bf16 = [&](__m128i u) {
    bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(u, exponent), exponent));
    const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, magnitude), exponent);
    const __m128i rounded = _mm_add_epi32(u, _mm_add_epi32(round, _mm_and_si128(_mm_srli_epi32(u, 16), one)));
    const __m128i quieted = _mm_or_si128(u, quiet);
    const __m128i r = _mm_or_si128(_mm_and_si128(nan, quieted), _mm_andnot_si128(nan, rounded));
    return _mm_srai_epi32(r, 16);
  };
  const bool aligned = reinterpret_cast<uintptr_t>(o) % 16 == 0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i lo = to_bf16(_mm_castps_si128(_mm_loadu_ps(c + j)));
    const __m128i hi = to_bf16(_mm_castps_si128(_mm_loadu_ps(c + j + 4)));
    const __m128i packed = _mm_packs_epi32(lo, hi);
    __m128i* to = reinterpret_cast<__m128i*>(o + j);
    if (stream && aligned) {
      _mm_stream_si128(to, packed);
    } else {
      _mm_storeu_si128(to, packed);
    }
  }
  bool tail = false;
  for (; j < n; ++j) {
    o[j] = FloatToBf16(c[j]);
    tail |= !std::isfinite(c[j]);
  }
  return wide_bad || tail || _mm_movemask_epi8(bad) != 0;
}

// Stores a task's rows into out rows out_row(i) (+ existing_row(i) when not
// NULL); a non-finite accumulator is replaced by exact(i, j), the
// reference's double sum (see the top). `stream`: rows without existing_out
// go around the cache (kStreamOutBytes); `isa`: sdk::HostIsa's (so that
// KREG_ISA_MASK holds here too).
template <typename OutRow, typename ExistingRow, typename Exact>
void StoreTask(const Task& task, const float* c, int64_t ldc, bool out_bf16, bool stream, uint32_t isa,
               OutRow&& out_row, ExistingRow&& existing_row, Exact&& exact) {
  if (c == nullptr) {
    // The micro-kernel stored the sums (PanelOut) and saw a non-finite
    // one: each non-finite out is recomputed. (With a bf16 out that takes
    // in a finite sum that rounded to an infinity too, where the exact sum
    // rounded once gives the same infinity or the largest bf16 below it.)
    for (int64_t i = 0; i < task.rows; ++i) {
      void* o = Advance(out_row(task.r0 + i), out_bf16, task.c0);
      for (int64_t j = 0; j < task.cols; ++j) {
        if (!std::isfinite(LoadAt(o, out_bf16, j))) StoreDouble(o, out_bf16, j, exact(task.r0 + i, task.c0 + j));
      }
    }
    return;
  }
  for (int64_t i = 0; i < task.rows; ++i) {
    void* o = Advance(out_row(task.r0 + i), out_bf16, task.c0);
    const void* e = existing_row(task.r0 + i);
    if (e != nullptr) e = Advance(e, out_bf16, task.c0);
    const float* ci = c + i * ldc;
    bool wild;
    if (e == nullptr) {
      wild = out_bf16 ? CopyBf16Row(static_cast<uint16_t*>(o), ci, task.cols, stream, isa)
                      : CopyF32Row(static_cast<float*>(o), ci, task.cols, stream);
    } else {
      if (out_bf16) {
        uint16_t* ob = static_cast<uint16_t*>(o);
        for (int64_t j = 0; j < task.cols; ++j) ob[j] = FloatToBf16(e ? ci[j] + LoadAt(e, true, j) : ci[j]);
      } else {
        float* of = static_cast<float*>(o);
        const float* ef = static_cast<const float*>(e);
        for (int64_t j = 0; j < task.cols; ++j) of[j] = ci[j] + ef[j];
      }
      wild = AnyNonFinite(ci, false, task.cols);
    }
    if (!wild) continue;
    for (int64_t j = 0; j < task.cols; ++j) {
      if (std::isfinite(ci[j])) continue;
      double d = exact(task.r0 + i, task.c0 + j);
      if (e != nullptr) d += LoadAt(e, out_bf16, j);
      StoreDouble(o, out_bf16, j, d);
    }
  }
  if (stream) _mm_sfence();  // the streamed rows before the task counts as done
}

// ---- gmm ---------------------------------------------------------------------------

// Local group `local`'s rhs as a [k, n] source (transposed in memory with
// transpose_rhs).
Src GmmRhsSrc(const GroupedView& v, int64_t local) {
  const Mat m = GmmRhs(v, local);
  return {m.p, m.ld, m.bf16, v.transpose_rhs};
}

kreg_status GmmCheck(const kreg_config* config, const kreg_args* args, const kreg_host* host, char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    Tiling t;
    if (kreg_status s = ReadConfig(config, v.in_bf16, &t, msg, cap); s != KREG_OK) return s;
    return CheckCpu(args, host, msg, cap);
  });
}

kreg_status GmmPrepare(const kreg_config* config, const kreg_args* args, const kreg_host* host, void** state,
                       char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    *state = nullptr;
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (!v.constant_weights) return KREG_OK;
    auto w = std::make_unique<PackedWeights>();
    if (kreg_status s = ReadConfig(config, v.in_bf16, &w->t, msg, cap); s != KREG_OK) return s;
    const int nr = w->t.micro->nr;
    const bool pairs = w->t.micro->bf16_pairs;
    w->depth = v.k;
    w->n_pad = (v.n + nr - 1) / nr * nr;
    w->groups.resize(v.local_groups);
    const int64_t elems = PackedKc(v.k, pairs) * w->n_pad;
    for (auto& g : w->groups) g.reset(new char[std::max<int64_t>(elems, 1) * ElemBytes(pairs)]);
    // One group per task.
    kreg_status status = ParallelFor(v.local_groups, host, [&](int64_t g) {
      for (int64_t p0 = 0; p0 < v.k; p0 += w->t.tk) {
        PackB(GmmRhsSrc(v, g), p0, std::min(w->t.tk, v.k - p0), 0, v.n, nr, pairs,
              const_cast<void*>(w->Slice(g, p0, 0)));
      }
    });
    if (status != KREG_OK) return Finish(status, msg, cap);
    *state = w.release();
    return KREG_OK;
  });
}

void GmmRelease(void* state) { delete static_cast<PackedWeights*>(state); }

kreg_status GmmRun(const kreg_config* config, const kreg_args* args, void* state, void*, size_t,
                   const kreg_host* host, char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewGmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    Tiling t;
    if (kreg_status s = ReadConfig(config, v.in_bf16, &t, msg, cap); s != KREG_OK) return s;
    const PackedWeights* packed = static_cast<const PackedWeights*>(state);
    const std::vector<int64_t> starts = GroupStarts(v);
    const Mat lhs = GmmLhs(v);
    const OutMat out = GmmOut(v);
    std::vector<Product> products;
    for (int64_t g = v.group_offset; g < v.group_offset + v.local_groups; ++g) {
      Product pr;
      pr.rows = starts[g + 1] - starts[g];
      pr.depth = v.k;
      pr.a = {lhs.Row(starts[g]), lhs.ld, v.in_bf16, false};
      pr.b = GmmRhsSrc(v, g - v.group_offset);
      pr.local = g - v.group_offset;
      pr.first = starts[g];
      if (pr.rows > 0) products.push_back(pr);
    }
    const Mat existing = v.existing != nullptr ? GmmExisting(v) : Mat{};
    const bool stream = v.m * v.n * (out.bf16 ? 2 : 4) > kStreamOutBytes;
    const uint32_t isa = HostIsa(host);
    kreg_status status = RunProducts(
        products, v.n, t, packed, host,
        [&](const Product& pr, const Task& task) {
          if (v.existing != nullptr) return PanelOut{};
          return PanelOut{Advance(out.Row(pr.first + task.r0), out.bf16, task.c0), out.ld, out.bf16, stream};
        },
        [&](const Product& pr, const Task& task, const float* c, int64_t ldc) {
          const Mat rhs = GmmRhs(v, pr.local);
          StoreTask(
              task, c, ldc, out.bf16, stream, isa, [&](int64_t i) { return out.Row(pr.first + i); },
              [&](int64_t i) { return v.existing != nullptr ? existing.Row(pr.first + i) : nullptr; },
              [&](int64_t i, int64_t j) { return GmmDot(lhs, pr.first + i, rhs, j, v.k, v.transpose_rhs); });
        });
    if (status != KREG_OK) return Finish(status, msg, cap);

    // Rows no local group covers: existing_out, or zeros.
    const int64_t first = starts[v.group_offset], last = starts[v.group_offset + v.local_groups];
    status = ParallelFor(v.m - (last - first), host, [&](int64_t i) {
      const int64_t r = i < first ? i : last + (i - first);
      void* o = out.Row(r);
      const size_t bytes = static_cast<size_t>(v.n) * (out.bf16 ? 2 : 4);
      if (v.existing != nullptr) {
        std::memmove(o, existing.Row(r), bytes);
      } else {
        std::memset(o, 0, bytes);
      }
    }, 16);
    return Finish(status, msg, cap);
  });
}

// ---- tgmm --------------------------------------------------------------------------

kreg_status TgmmCheck(const kreg_config* config, const kreg_args* args, const kreg_host* host, char* msg,
                      size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewTgmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    Tiling t;
    if (kreg_status s = ReadConfig(config, v.in_bf16, &t, msg, cap); s != KREG_OK) return s;
    return CheckCpu(args, host, msg, cap);
  });
}

kreg_status TgmmRun(const kreg_config* config, const kreg_args* args, void*, void*, size_t, const kreg_host* host,
                    char* msg, size_t cap) {
  return Guarded(msg, cap, [&]() -> kreg_status {
    GroupedView v;
    if (!ViewTgmm(args, &v, msg, cap)) return KREG_INVALID_ARGUMENT;
    if (kreg_status s = CheckCpu(args, host, msg, cap); s != KREG_OK) return s;
    Tiling t;
    if (kreg_status s = ReadConfig(config, v.in_bf16, &t, msg, cap); s != KREG_OK) return s;
    const std::vector<int64_t> starts = GroupStarts(v);
    const Mat lhs = TgmmLhs(v), rhs = TgmmRhs(v);
    std::vector<Product> products;
    for (int64_t g = v.group_offset; g < v.group_offset + v.local_groups; ++g) {
      Product pr;
      pr.rows = v.k;
      pr.depth = starts[g + 1] - starts[g];
      pr.a = {Advance(lhs.p, v.in_bf16, starts[g]), lhs.ld, v.in_bf16, false};
      pr.b = {rhs.Row(starts[g]), rhs.ld, v.in_bf16, false};
      pr.local = g - v.group_offset;
      pr.pack_a = true;
      products.push_back(pr);
    }
    const bool stream = v.local_groups * v.k * v.n * (v.out_bf16 ? 2 : 4) > kStreamOutBytes;
    const uint32_t isa = HostIsa(host);
    return Finish(RunProducts(products, v.n, t, nullptr, host,
                              [&](const Product& pr, const Task& task) {
                                const OutMat out = TgmmOut(v, pr.local);
                                return PanelOut{Advance(out.Row(task.r0), out.bf16, task.c0), out.ld, out.bf16,
                                                stream};
                              },
                              [&](const Product& pr, const Task& task, const float* c, int64_t ldc) {
                                const OutMat out = TgmmOut(v, pr.local);
                                const int64_t begin = starts[v.group_offset + pr.local];
                                StoreTask(
                                    task, c, ldc, out.bf16, stream, isa, [&](int64_t i) { return out.Row(i); },
                                    [](int64_t) -> const void* { return nullptr; },
                                    [&](int64_t i, int64_t j) {
                                      return TgmmDot(lhs, i, rhs, j, begin, begin + pr.depth);
                                    });
                              }),
                  msg, cap);
  });
}

}  // namespace

extern const kreg_kernel kGmmTiledKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "gmm",
    .variant = "tiled",
    .version = 2,
    .doc = "tm x tn tasks over all groups on oneTBB, largest first; B packed in slices of tk; register-blocked "
           "micro-kernel (generic, AVX2, AVX-512, AVX512_BF16, AMX-BF16); rhs packed once in prepare with constant_weights=1",
    .params = kParams,
    .num_params = kNumParams,
    .check = GmmCheck,
    .run = GmmRun,
    .prepare = GmmPrepare,
    .release = GmmRelease,
};

extern const kreg_kernel kTgmmTiledKernel = {
    .struct_size = sizeof(kreg_kernel),
    .op = "tgmm",
    .variant = "tiled",
    .version = 2,
    .doc = "tm x tn tasks over all groups on oneTBB, largest first; B packed in slices of tk; register-blocked "
           "micro-kernel (generic, AVX2, AVX-512, AVX512_BF16, AMX-BF16)",
    .params = kParams,
    .num_params = kNumParams,
    .check = TgmmCheck,
    .run = TgmmRun,
};

}  // namespace kreg::gmm
