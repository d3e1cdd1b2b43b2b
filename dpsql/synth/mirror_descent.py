"""mbi's mirror descent without the two marginal passes dpsql never reads.

``mbi.estimation.MirrorDescent`` computes the model's marginals once before the
loop (for an initial loss that the first step overwrites) and once after it (for
the returned model's ``marginals``). Each is a separately compiled JAX program
(the Hugin message passing), compiled again for every new model structure: a
quarter of the compile time of an ``aim`` fit, where a fit is compile-bound
(``benchmarks/aim_fit_parts.py``). dpsql reads only the potentials and the total
(:class:`dpsql.synth.pgm.Inference` computes marginals in numpy), so this
subclass skips both passes; the iterations, and so the fitted potentials, are
mbi's own. Imported only inside :func:`dpsql.synth.pgm.float64` (mbi is the
``synth`` extra).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from mbi.clique_vector import CliqueVector
from mbi.estimation import MirrorDescent, MirrorDescentState


class Potentials(NamedTuple):
    """A fitted model as dpsql uses it: log-potentials per clique and the row total."""

    potentials: CliqueVector
    total: float


@dataclasses.dataclass(frozen=True)
class LeanMirrorDescent(MirrorDescent):
    """Mirror descent with Armijo steps (mbi's), returning potentials, not marginals."""

    def _init(self, domain: Any, loss_fn: Any, known_total: float, *, warm_start: Any = None,
              constraints: Any = ()) -> MirrorDescentState:
        if warm_start is None:
            potentials = CliqueVector.zeros(domain, loss_fn.cliques)
        else:
            potentials = getattr(warm_start, "potentials", warm_start).expand(loss_fn.cliques)
        # Each step computes mu and the loss afresh from the potentials, so the state's
        # first mu only needs the marginals' structure, which the potentials share.
        alpha = 2.0 / (loss_fn.lipschitz * known_total) if self.stepsize is None \
            else self.stepsize
        return MirrorDescentState(potentials, potentials, alpha, jnp.asarray(np.float64(np.inf)))

    def _finalize(self, state: MirrorDescentState, known_total: float,
                  constraints: Any = ()) -> Potentials:
        return Potentials(state.potentials, float(known_total))
