"""The E2M1 (FP4) value grid and its rounding rule, shared by ds4_numerics.py
(torch) and v41_reference.py (numpy): plain Python, the caller passes its
array library's `where`."""

# The magnitudes an E2M1 code stands for, by code (sign bit aside).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_magnitude(a, where):
    """Nearest E2M1 magnitude of `a` (0 <= a <= 6), ties to the even grid
    index: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.

    Built as nested `where(a <= mid, lower, ...)` over the midpoints between
    neighbouring grid values, the lowest outermost; at a midpoint the lower
    value wins when its index is even (`<=`), the upper one when it is odd
    (`<`)."""
    q = E2M1_GRID[-1]
    for i in reversed(range(len(E2M1_GRID) - 1)):
        lower, upper = E2M1_GRID[i], E2M1_GRID[i + 1]
        mid = (lower + upper) / 2  # exact: every grid value is a small dyadic
        q = where(a <= mid if i % 2 == 0 else a < mid, lower, q)
    return q
