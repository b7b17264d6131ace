"""kreg's top-k order in NumPy and adversarial rows for it, shared by the
Python tests (test_bindings.py, test_jax.py)."""

import numpy as np


def topk_reference(x, k, largest=True, starts=None, ends=None):
    """kreg's top-k (DESIGN.md): NaN of either sign above +inf when largest
    and below -inf when smallest, -0 == +0, ties by ascending index; a range
    shorter than k is padded with index -1."""
    batch, n = x.shape
    idx = np.full((batch, k), -1, np.int64)
    for r in range(batch):
        lo = 0 if starts is None else starts[r]
        hi = n if ends is None else ends[r]
        row = x[r, lo:hi].astype(np.float64)
        nan = np.isnan(row)
        v = np.where(nan, 0.0, row)
        cols = np.arange(lo, hi)
        order = np.lexsort((cols, -v, ~nan)) if largest else np.lexsort((cols, v, nan))
        take = cols[order[:k]]
        idx[r, : len(take)] = take
    return idx


def adversarial_rows(n, rng):
    rows = [
        rng.standard_normal(n),
        np.full(n, 1.5),                                             # all equal
        rng.integers(-2, 3, n).astype(np.float64),                   # ties
        np.where(rng.random(n) < 0.5, 0.0, -0.0),                    # +0 and -0
        np.where(rng.random(n) < 0.2, np.inf, -np.inf),              # infinities
        np.where(rng.random(n) < 0.1, np.nan, rng.standard_normal(n)),
    ]
    neg_nan = np.full(n, np.nan)
    neg_nan[::2] = -np.nan                                           # NaN of both signs
    neg_nan[1::3] = np.inf
    rows.append(neg_nan)
    return np.stack(rows).astype(np.float32)
