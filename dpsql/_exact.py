"""Exact integer sampling machinery behind :mod:`dpsql.noise` (private).

Everything here is vectorized over numpy arrays and uses integer arithmetic
only: uniform integers by rejection, Bernoulli(p) for rational p, and
Bernoulli(exp(-gamma)) for rational gamma by the method of Canonne, Kamath and
Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
Algorithms 1-3. Loops run over the shrinking set of still-undecided indices,
never once per element; a handful of draws (``SCALAR_DRAWS``) take the same
algorithms in plain Python ints instead, which is several times faster there.
Randomness comes from the OS CSPRNG (``os.urandom``), buffered and handed out
under a lock, and never from ``numpy.random``.

Bounds are kept below 2**63 so that int64 never overflows; the few values that
could (far tails of a proposal) take an exact pure-Python path instead.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

from dpsql.errors import InternalError

_I64_LIMIT = 1 << 63
_CHUNK = 1 << 20  # bytes fetched from the OS per refill
_WIDTHS = ((8, np.uint8), (16, np.uint16), (32, np.uint32), (64, np.uint64))

#: Largest |d| whose square fits int64 (floor(sqrt(2**63 - 1))).
D_MAX = 3_037_000_499


class _Entropy:
    """OS randomness handed out in slices of a large buffer, each byte once."""

    def __init__(self, chunk: int = _CHUNK) -> None:
        self._chunk = chunk
        self._lock = threading.Lock()
        self._buf = memoryview(b"")
        self._pos = 0

    def take(self, nbytes: int) -> memoryview | bytes:
        if nbytes > self._chunk // 4:
            return os.urandom(nbytes)
        with self._lock:
            if self._pos + nbytes > len(self._buf):
                self._buf = memoryview(os.urandom(self._chunk))
                self._pos = 0
            out = self._buf[self._pos : self._pos + nbytes]
            self._pos += nbytes
        return out

    def reset(self) -> None:
        """Forget the buffer; called in a forked child so it never replays the parent's bytes."""
        self._buf = memoryview(b"")
        self._pos = 0
        self._lock = threading.Lock()


ENTROPY = _Entropy()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=ENTROPY.reset)


def words(width: int, size: int) -> np.ndarray:
    """``size`` uniform unsigned integers of ``width`` bits (8, 16, 32 or 64)."""
    dtype = dict(_WIDTHS)[width]
    return np.frombuffer(ENTROPY.take(size * (width // 8)), dtype=dtype)


def random_bits(size: int) -> np.ndarray:
    """``size`` fair coin flips as a bool array."""
    raw = np.frombuffer(ENTROPY.take((size + 7) // 8), dtype=np.uint8)
    return np.unpackbits(raw, count=size).view(bool)


def _width_for(bound: int) -> int:
    """Pick the narrowest word width that rejects at most 1/16 of its draws for ``bound``."""
    for width, _ in _WIDTHS[:-1]:
        if bound <= 1 << (width - 4):
            return width
    return 64


def uniform_below(m: int | np.ndarray, size: int | None = None) -> np.ndarray:
    """Exact uniform integers in ``[0, m)`` as int64.

    ``m`` is one positive int (then ``size`` draws) or an int64 array of
    positive bounds (one draw each), all below 2**63. A word ``r`` of ``w`` bits
    is accepted when ``r < 2**w - (2**w mod m)`` and mapped to ``r mod m``.
    """
    if isinstance(m, np.ndarray):
        return _uniform_below_array(m)
    m = int(m)
    if size is None:
        raise InternalError("uniform_below with a scalar bound needs a size")
    if not 0 < m < _I64_LIMIT:
        raise InternalError(f"uniform_below bound {m} outside [1, 2**63)")
    if m == 1:
        return np.zeros(size, dtype=np.int64)
    if m & (m - 1) == 0:  # a power of two: mask, no rejection
        width = next(w for w, _ in _WIDTHS if m.bit_length() - 1 <= w)
        return (words(width, size) & (m - 1)).astype(np.int64)
    width = _width_for(m)
    limit = (1 << width) - (1 << width) % m
    r = words(width, size)
    out = (r % m).astype(np.int64)
    todo = np.flatnonzero(r >= limit)  # at most 1/16 of the draws
    while todo.size:
        r = words(width, todo.size)
        ok = r < limit
        out[todo[ok]] = r[ok] % m
        todo = todo[~ok]
    return out


def _uniform_below_array(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.int64)
    out = np.empty(m.size, dtype=np.int64)
    if m.size == 0:
        return out
    if int(m.min()) < 1:
        raise InternalError("uniform_below bounds must be positive")
    width = _width_for(int(m.max()))
    if width < 64:
        limit = (1 << width) - (1 << width) % m
        r = words(width, m.size).astype(np.int64)
        out = r % m
        todo = np.flatnonzero(r >= limit)
        while todo.size:
            r = words(width, todo.size).astype(np.int64)
            ok = r < limit[todo]
            out[todo[ok]] = r[ok] % m[todo[ok]]
            todo = todo[~ok]
        return out
    mu = m.astype(np.uint64)
    top = ~((np.zeros_like(mu) - mu) % mu)  # 2**64 - 1 - (2**64 mod m): largest accepted word
    todo = np.arange(m.size)
    while todo.size:
        r = words(64, todo.size)
        ok = r <= top[todo]
        out[todo[ok]] = (r[ok] % mu[todo[ok]]).astype(np.int64)
        todo = todo[~ok]
    return out


def bernoulli(num: int | np.ndarray, den: int | np.ndarray, size: int) -> np.ndarray:
    """Bernoulli(num/den) for integers 0 <= num <= den (scalars or arrays of length ``size``)."""
    if isinstance(den, np.ndarray):
        return uniform_below(den) < num
    return uniform_below(den, size) < num


def bernoulli_exp_frac(num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for an int64 array ``num`` with 0 <= num <= den (CKS Alg. 1).

    K = 1, 2, ...: draw A ~ Bernoulli(num/(den K)); the first K with A = 0
    decides, returning K odd. All undecided elements share K, so each round is
    one vectorized draw; when den*K would leave int64 the draw is split into the
    product Bernoulli(num/den) * Bernoulli(1/K), which is the same law.
    """
    out = np.empty(num.size, dtype=bool)
    todo = np.arange(num.size)
    k = 1
    while todo.size:
        live = num[todo]
        if den * k < _I64_LIMIT:
            a = bernoulli(live, den * k, todo.size)
        else:
            a = bernoulli(live, den, todo.size) & (uniform_below(k, todo.size) == 0)
        out[todo[~a]] = k % 2 == 1
        todo = todo[a]
        k += 1
    return out


def bernoulli_exp_minus_one(size: int) -> np.ndarray:
    """``size`` draws of Bernoulli(exp(-1)) by Alg. 1 with gamma = 1.

    Round K = 1 always passes. Rounds 2 and 3 share one uniform x in [0, 6):
    x mod 2 and x // 2 are independent uniforms on [0, 2) and [0, 3), and a
    round passes iff its digit is 0. So x odd fails at K = 2 (False), x in
    {2, 4} fails at K = 3 (True), and x = 0 continues the loop from K = 4.
    """
    x = uniform_below(6, size)
    out = (x == 2) | (x == 4)
    todo = np.flatnonzero(x == 0)
    k = 4
    while todo.size:
        a = uniform_below(k, todo.size) == 0
        out[todo[~a]] = k % 2 == 1
        todo = todo[a]
        k += 1
    return out


def all_exp_minus_one(q: np.ndarray) -> np.ndarray:
    """Per element, whether ``q`` independent Bernoulli(exp(-1)) trials all succeed."""
    ok = np.ones(q.size, dtype=bool)
    todo = np.flatnonzero(q > 0)
    left = q[todo]
    while todo.size:
        s = bernoulli_exp_minus_one(todo.size)
        ok[todo[~s]] = False
        left = left[s] - 1
        todo = todo[s]
        more = left > 0
        todo, left = todo[more], left[more]
    return ok


def exp_minus_one_successes(size: int) -> np.ndarray:
    """Successes before the first failure of Bernoulli(exp(-1)) trials (geometric), int64."""
    count = np.zeros(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        s = bernoulli_exp_minus_one(todo.size)
        todo = todo[s]
        count[todo] += 1
    return count


def bernoulli_exp(num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for an int64 array ``num`` >= 0 and an int ``den`` > 0.

    exp(-gamma) = exp(-1)**floor(gamma) * exp(-frac(gamma)): the integer part
    runs first because each of its trials already rejects 63% of elements.
    """
    q, r = np.divmod(num, den)
    ok = all_exp_minus_one(q)
    live = np.flatnonzero(ok)
    ok[live] = bernoulli_exp_frac(r[live], den)
    return ok


def _uniform_below_int(m: int) -> int:
    """One exact uniform integer in [0, m) for an arbitrary Python int m >= 1."""
    bits = (m - 1).bit_length()
    if bits == 0:
        return 0
    nbytes = (bits + 7) // 8
    mask = (1 << bits) - 1
    while True:
        r = int.from_bytes(ENTROPY.take(nbytes), "little") & mask
        if r < m:
            return r


def bernoulli_exp_frac_int(num: int, den: int) -> bool:
    """One Bernoulli(exp(-num/den)) for Python ints 0 <= num <= den (CKS Alg. 1)."""
    k = 1
    while _uniform_below_int(den * k) < num:
        k += 1
    return k % 2 == 1


def bernoulli_exp_int(num: int, den: int) -> bool:
    """One Bernoulli(exp(-num/den)) for Python ints of any size (num >= 0, den > 0)."""
    q, r = divmod(num, den)
    while q > 0:  # exp(-1)**q: each trial fails with probability 0.63, so few run
        if not bernoulli_exp_frac_int(1, 1):
            return False
        q -= 1
    return bernoulli_exp_frac_int(r, den)


def laplace_int(t: int, s: int) -> int:
    """One discrete Laplace draw, P(z) proportional to exp(-|z| s / t): CKS Alg. 2 in ints."""
    while True:
        u = _uniform_below_int(t)
        if not bernoulli_exp_frac_int(u, t):
            continue
        v = 0
        while bernoulli_exp_frac_int(1, 1):
            v += 1
        if v >= 2**22:  # probability below exp(-4 million); int64 callers need the bound
            raise InternalError("discrete_laplace geometric count overflowed; please report")
        y = (u + t * v) // s
        negative = _uniform_below_int(2) == 1
        if not (negative and y == 0):  # the draw "-0" would count zero twice
            return -y if negative else y


def gaussian_int(t: int, c_num: int, c_den: int) -> int:
    """One discrete Gaussian draw, sigma^2 = t c_num / c_den: CKS Alg. 3 in ints."""
    den = 2 * c_num * c_den * t
    while True:
        y = laplace_int(t, 1)
        d = abs(y) * c_den - c_num
        if bernoulli_exp_int(d * d, den):
            return y


#: Up to this many draws, one at a time in Python ints beats numpy's per-call cost.
SCALAR_DRAWS = 8

_BATCH = 1 << 18  # proposals per round: bounds memory, keeps arrays cache-sized


def _collect(size: int, attempt: Callable[[int], np.ndarray]) -> np.ndarray:
    """Concatenate accepted draws of ``attempt(k)`` (k proposals each) until ``size`` are in.

    Proposals are i.i.d. and acceptance is decided per proposal, so accepted
    values are i.i.d. from the target law; keeping the first ``size`` of them
    (a stopping rule on counts only) keeps that law. Each round proposes about
    what the acceptance rate seen so far says is needed.
    """
    parts = []
    have, proposed, accepted = 0, 0, 0
    while have < size:
        need = size - have
        rate = max(accepted / proposed, 0.05) if proposed else 0.5
        k = min(_BATCH, int(need / rate * 1.05) + 64)
        got = attempt(k)
        proposed, accepted = proposed + k, accepted + got.size
        parts.append(got[:need])
        have += parts[-1].size
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _laplace_attempt(t: int, s: int, k: int) -> np.ndarray:
    """One vectorized pass of CKS Alg. 2 over ``k`` proposals; returns the accepted draws."""
    u = uniform_below(t, k)
    u = u[bernoulli_exp_frac(u, t)]
    v = exp_minus_one_successes(u.size)
    if v.size and int(v.max()) >= 2**22:  # probability below exp(-4 million)
        raise InternalError("discrete_laplace geometric count overflowed; please report")
    y = u + t * v
    if s > 1:
        y //= s
    b = random_bits(y.size)
    keep = ~(b & (y == 0))  # the draw "-0" would count zero twice
    return np.where(b, -y, y)[keep]


def discrete_laplace(t: int, s: int, size: int) -> np.ndarray:
    """Discrete Laplace draws with P(z) proportional to exp(-|z| s / t) (CKS Alg. 2), int64.

    U ~ Uniform[0, t), keep with probability exp(-U/t); V ~ Geometric (count of
    Bernoulli(exp(-1)) successes); X = U + tV is geometric with ratio exp(-1/t);
    Y = floor(X / s), a random sign, and the duplicate zero (B = 1, Y = 0) is
    rejected.
    """
    if t < 1 or s < 1 or t * 2**22 >= _I64_LIMIT:
        raise InternalError(f"discrete_laplace parameters t={t}, s={s} out of range")
    if size <= SCALAR_DRAWS:
        return np.array([laplace_int(t, s) for _ in range(size)], dtype=np.int64)
    return _collect(size, lambda k: _laplace_attempt(t, s, k))


def discrete_gaussian(t: int, c_num: int, c_den: int, size: int, d_max: int = D_MAX) -> np.ndarray:
    """Discrete Gaussian draws with variance parameter sigma^2 = t * c_num / c_den (CKS Alg. 3).

    Propose Y from the discrete Laplace with scale t and accept with
    probability exp(-gamma), gamma = (|Y| - sigma^2/t)^2 / (2 sigma^2)
    = d^2 / den with d = |Y| c_den - c_num and den = 2 c_num c_den t. This is
    exact for any integer t >= 1. When |d| > ``d_max`` (d^2 would overflow),
    gamma > floor(d_max^2 / den) is known, so that many exp(-1) trials run
    vectorized first and only their rare survivors finish in Python ints.
    A few draws (``SCALAR_DRAWS``, e.g. one global aggregate) run in Python
    ints throughout, where nothing overflows.
    """
    den = 2 * c_num * c_den * t
    if not (0 < c_num <= d_max and den < _I64_LIMIT):
        raise InternalError(f"discrete_gaussian parameters ({t}, {c_num}, {c_den}) out of range")
    if t * 2**22 >= _I64_LIMIT:
        raise InternalError(f"discrete_gaussian proposal scale t={t} out of range")
    q_far = d_max * d_max // den
    a_cap = (c_num + d_max) // c_den + 1  # |Y| >= a_cap implies d > d_max

    def attempt(k: int) -> np.ndarray:
        y = _laplace_attempt(t, 1, k)
        d = np.minimum(np.abs(y), a_cap) * c_den - c_num
        near = d <= d_max  # d >= -c_num >= -d_max always
        accept = np.empty(y.size, dtype=bool)
        dn = d[near]
        accept[near] = bernoulli_exp(dn * dn, den)
        far = np.flatnonzero(~near)
        if far.size:
            alive = all_exp_minus_one(np.full(far.size, q_far, dtype=np.int64))
            accept[far] = alive
            for i in far[alive]:
                exact = abs(int(y[i])) * c_den - c_num
                accept[i] = bernoulli_exp_int(exact * exact - q_far * den, den)
        return y[accept]

    if size <= SCALAR_DRAWS:
        return np.array([gaussian_int(t, c_num, c_den) for _ in range(size)], dtype=np.int64)
    return _collect(size, attempt)
