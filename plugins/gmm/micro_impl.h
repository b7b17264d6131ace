// The one template behind every micro-kernel set (see micro.h). Included by
// each micro_*.cc inside an anonymous namespace, after that file's target
// pragma and its traits type, so each ISA gets its own copy and no
// instruction of one ISA leaks into another's code. No include guard: it is
// meant to be included once per file. Traits V provide:
//   Elem              the element type of A and B (float, or uint16_t bf16)
//   kLanes            floats per accumulator vector
//   kPack             elements of the reduction per step (1, or 2: pairs)
//   kRoundInRegisters whether a bf16 out is rounded from the accumulators
//                     themselves (32 registers), or from a copy in L1 (16)
//   Acc, A, B         vector types; Zero(), LoadC(p), StoreC(p, acc),
//                     StreamC(p, acc) (non-temporal, p aligned), StoreBf16(p,
//                     lo, hi, stream) (2 * kLanes rounded to bf16), Probe(
//                     probe, acc) (probe + acc * 0), Wild(probe) (a NaN lane),
//   Bcast(row, q)     step q of an A row (elements kPack*q ...) broadcast,
//   LoadB(p)          one vector of a B strip, Madd(acc, a, b) = acc + a.b.

// The prefetch region of a panel (PanelArgs): each block takes its share of
// the lines, one per step of its reduction loop, so that the fetches are
// spread over the panel's FMAs rather than issued in bursts.
struct Prefetcher {
  const char* at = nullptr;
  int64_t row_lines = 0, skip = 0, col = 0, line = 0, lines = 0, per_block = 0, end = 0;

  Prefetcher(const PanelArgs& p, int64_t blocks) {
    if (p.prefetch == nullptr || p.prefetch_rows <= 0 || p.prefetch_row_bytes <= 0) return;
    at = p.prefetch;
    row_lines = (p.prefetch_row_bytes + 63) / 64;
    skip = p.prefetch_ld - row_lines * 64;
    lines = p.prefetch_rows * row_lines;
    per_block = (lines + blocks - 1) / blocks;
  }
  // A block's share: Begin before it, One per step, Rest after it (the
  // lines a short reduction left).
  void Begin() { end = line + per_block < lines ? line + per_block : lines; }
  void One() {
    if (line >= end) return;
    __builtin_prefetch(at, 0, 2);
    ++line;
    at += 64;
    if (++col == row_lines) {
      col = 0;
      at += skip;
    }
  }
  void Rest() {
    while (line < end) One();
  }
};

// A strip of B still in place (PanelArgs::b_src): step q at p + q * ld.
struct StripSource {
  const float* p = nullptr;
  int64_t ld = 0;
};

// Steps ahead that a packing block prefetches its strip's rows: they lie
// a row of rhs apart (a page apart when n is large), where the hardware
// prefetchers stop, and a task's first slice comes from memory.
constexpr int64_t kPackAhead = 16;

// One mr x (2 * kLanes) block over the whole slice, kept in registers, its
// sums stored to C, or to out where out.p is set (at the block's corner).
// kPacking (f32 sets): B's strip is read from src and written to b packed.
template <class V, int kMr, bool kPacking>
inline void Block(int64_t steps, const typename V::Elem* const* arow, const typename V::Elem* b,
                  const StripSource& src, float* c, int64_t ldc, bool accumulate, const PanelOut& out,
                  Prefetcher& pf) {
  constexpr int kNv = 2, kNr = kNv * V::kLanes;
  typename V::Acc r[kMr][kNv];
  for (int i = 0; i < kMr; ++i) {
    for (int v = 0; v < kNv; ++v) r[i][v] = accumulate ? V::LoadC(c + i * ldc + v * V::kLanes) : V::Zero();
  }
  for (int64_t q = 0; q < steps; ++q) {
    pf.One();
    typename V::B bv[kNv];
    if constexpr (kPacking) {
      static_assert(V::kPack == 1, "packing in the panel takes f32 strips");
      if (q + kPackAhead < steps) {
        const float* ahead = src.p + (q + kPackAhead) * src.ld;
        __builtin_prefetch(ahead);
        __builtin_prefetch(ahead + kNr - 1);
      }
      float* packed = const_cast<float*>(b) + q * kNr;
      for (int v = 0; v < kNv; ++v) {
        bv[v] = V::LoadB(src.p + q * src.ld + v * V::kLanes);
        V::StoreC(packed + v * V::kLanes, bv[v]);
      }
    } else {
      for (int v = 0; v < kNv; ++v) bv[v] = V::LoadB(b + (q * kNr + v * V::kLanes) * V::kPack);
    }
    for (int i = 0; i < kMr; ++i) {
      const typename V::A x = V::Bcast(arow[i], q);
      for (int v = 0; v < kNv; ++v) r[i][v] = V::Madd(r[i][v], x, bv[v]);
    }
  }
  if (out.p == nullptr) {
    for (int i = 0; i < kMr; ++i) {
      for (int v = 0; v < kNv; ++v) V::StoreC(c + i * ldc + v * V::kLanes, r[i][v]);
    }
    return;
  }
  static_assert(kNv == 2, "StoreBf16 takes a block row's two vectors");
  typename V::Acc probe = V::Zero();
  for (int i = 0; i < kMr; ++i) {
    for (int v = 0; v < kNv; ++v) probe = V::Probe(probe, r[i][v]);
  }
  if (V::Wild(probe)) *out.wild = true;
  if (out.bf16) {
    uint16_t* o = static_cast<uint16_t*>(out.p);
    if constexpr (V::kRoundInRegisters) {
      for (int i = 0; i < kMr; ++i) V::StoreBf16(o + i * out.ld, r[i][0], r[i][1], out.stream);
    } else {
      // Rounded from a copy in L1, the sums' registers free first: with 16
      // registers, rounding them in place (its constants beside twelve
      // accumulators) made GCC keep the accumulators in memory across the
      // whole loop above, at half the AVX2 set's speed, f32 out as well.
      // The barrier keeps the compiler from folding the copy away.
      alignas(64) float sums[kMr][kNr];
      for (int i = 0; i < kMr; ++i) {
        for (int v = 0; v < kNv; ++v) V::StoreC(sums[i] + v * V::kLanes, r[i][v]);
      }
      asm volatile("" : : "r"(sums) : "memory");
      for (int i = 0; i < kMr; ++i) {
        V::StoreBf16(o + i * out.ld, V::LoadC(sums[i]), V::LoadC(sums[i] + V::kLanes), out.stream);
      }
    }
    return;
  }
  for (int i = 0; i < kMr; ++i) {
    for (int v = 0; v < kNv; ++v) {
      float* o = static_cast<float*>(out.p) + i * out.ld + v * V::kLanes;
      if (out.stream) {
        V::StreamC(o, r[i][v]);
      } else {
        V::StoreC(o, r[i][v]);
      }
    }
  }
}

// Block<V, r> for a block of r <= kR rows: a panel's last block is as high
// as the rows it holds, so that no row past the last is computed (a skewed
// grouping's small groups end in such a block, each).
template <class V, int kR, bool kPacking>
inline void BlockOfHeight(int r, int64_t steps, const typename V::Elem* const* arow, const typename V::Elem* b,
                          const StripSource& src, float* c, int64_t ldc, bool accumulate, const PanelOut& out,
                          Prefetcher& pf) {
  if constexpr (kR > 0) {
    if (r == kR) return Block<V, kR, kPacking>(steps, arow, b, src, c, ldc, accumulate, out, pf);
    return BlockOfHeight<V, kR - 1, kPacking>(r, steps, arow, b, src, c, ldc, accumulate, out, pf);
  }
}

// B strip outermost (it stays in L1 across the rows), then row blocks, the
// last as high as the rows left.
template <class V, int kMr>
void PanelT(const PanelArgs& p) {
  using Elem = typename V::Elem;
  constexpr int64_t kNr = 2 * V::kLanes;
  const Elem* a = static_cast<const Elem*>(p.a);
  const Elem* b = static_cast<const Elem*>(p.b);
  const int64_t steps = p.kc / V::kPack;
  Prefetcher prefetcher(p, p.strips * ((p.rows + kMr - 1) / kMr));
  for (int64_t s = 0; s < p.strips; ++s) {
    const Elem* strip = b + s * p.kc * kNr;
    for (int64_t i0 = 0; i0 < p.rows; i0 += kMr) {
      const Elem* arow[kMr];
      for (int i = 0; i < kMr; ++i) arow[i] = a + (i0 + i < p.rows ? i0 + i : p.rows - 1) * p.lda;
      prefetcher.Begin();
      float* c = p.c + i0 * p.ldc + s * kNr;
      PanelOut out = p.out;
      if (out.p != nullptr) out.p = static_cast<char*>(out.p) + (i0 * out.ld + s * kNr) * (out.bf16 ? 2 : 4);
      const int r = p.rows - i0 < kMr ? static_cast<int>(p.rows - i0) : kMr;
      // The strip's first block packs it, where B is still in place.
      const StripSource src = {p.b_src != nullptr && i0 == 0 ? p.b_src + s * kNr : nullptr, p.b_src_ld};
      if (src.p == nullptr) {
        BlockOfHeight<V, kMr, false>(r, steps, arow, strip, src, c, p.ldc, p.accumulate, out, prefetcher);
      } else if constexpr (V::kPack == 1) {
        BlockOfHeight<V, kMr, true>(r, steps, arow, strip, src, c, p.ldc, p.accumulate, out, prefetcher);
      }
      prefetcher.Rest();
    }
  }
}

template <class V>
void Panel(const PanelArgs& p) {
  if (p.rows <= 0 || p.strips <= 0) return;
  switch (p.mr) {
    case 4:
      return PanelT<V, 4>(p);
    case 6:
      return PanelT<V, 6>(p);
    default:
      break;
  }
  if constexpr (V::kMaxMr >= 12) {
    if (p.mr == 8) return PanelT<V, 8>(p);
    if (p.mr == 12) return PanelT<V, 12>(p);
  }
}
