"""The options of ``modp``: one dataclass, checked when it is made (before any charge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpsql.errors import ConfigurationError
from dpsql.synth.modp import device as devices

MODES = ("empirical", "dp")
MAX_DIAGNOSTIC_ROWS = 1_000_000


class _FollowsMode:
    """``is_dp`` of a configured instance: True exactly when ``mode=dp``.

    Read on the class (no mode chosen yet) it is False, so a caller that checks
    before configuring treats MODP as not DP.
    """

    def __get__(self, instance: ModpOptions | None, owner: type | None = None) -> bool:
        return instance is not None and instance.mode == "dp"

    def __set__(self, instance: ModpOptions, value: bool) -> None:
        raise ConfigurationError("modp's is_dp follows its mode; set mode=dp or "
                                 "mode=empirical instead")


@dataclass
class ModpOptions:
    """The options of ``modp`` (:class:`~dpsql.synth.modp.synthesizer.Modp`), checked.

    Fields are the options (``--option k=v``); the defaults follow the paper's
    best model (5 blades, 15 reduced features). ``is_dp`` depends on ``mode``:
    the release refuses ``empirical`` unless the policy allows non-DP releases.
    """

    name = "modp"  # not a field: a class attribute every instance reads
    is_dp = _FollowsMode()
    privacy_lowering_options: ClassVar[tuple[str, ...]] = ("passthrough",)

    mode: str = "empirical"
    blades: int = 5
    reduced_features: int = 15
    device: str = "auto"
    lr: float | None = None  # Adam step size; default 0.01 (empirical) / 0.003 (dp)
    # empirical training
    epochs: int = 40
    warmup_epochs: int = 3
    batch_size: int = 1024
    patience: int = 3
    # empirical refinements (paper sec. 4.2-4.4)
    structural_zeros: bool = False
    passthrough: float = 0.0
    two_instance: float = 0.0  # fraction of rows that take a second draw (paper sec. 4.4)
    diagnostic_rows: int = 1000
    # dp
    steps: int = 100
    clip: float = 1.0
    sampling_rate: float = 1.0
    seed_share: float = 0.1
    passes: int = 5

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigurationError(f"modp mode must be one of {', '.join(MODES)}, "
                                     f"got {self.mode!r}")
        for name in ("blades", "reduced_features", "epochs", "batch_size", "patience", "steps",
                     "passes"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"modp option {name} must be at least 1")
        if self.warmup_epochs < 0 or self.diagnostic_rows < 0:
            raise ConfigurationError("modp options warmup_epochs and diagnostic_rows must be "
                                     ">= 0")
        if self.diagnostic_rows > MAX_DIAGNOSTIC_ROWS:  # DP mode draws them after the charge
            raise ConfigurationError(f"modp option diagnostic_rows must be at most "
                                     f"{MAX_DIAGNOSTIC_ROWS:,}")
        if not 0 <= self.passthrough < 1:
            raise ConfigurationError("modp option passthrough is a probability in [0, 1)")
        if not 0 <= self.two_instance < 1:
            raise ConfigurationError("modp option two_instance is a fraction of rows in [0, 1)")
        if not 0 < self.sampling_rate <= 1:
            raise ConfigurationError("modp option sampling_rate must be in (0, 1]; 1 is full "
                                     "batch")
        if not 0 < self.seed_share < 1:
            raise ConfigurationError("modp option seed_share must be in (0, 1)")
        if self.clip <= 0 or (self.lr is not None and self.lr <= 0):
            raise ConfigurationError("modp options clip and lr must be positive")
        if self.mode == "dp":
            used = [n for n in ("structural_zeros", "passthrough", "two_instance")
                    if getattr(self, n)]
            if used:
                raise ConfigurationError(
                    f"modp option {', '.join(used)} reads the true rows after training and is "
                    "not DP; use it with mode=empirical")
        devices.resolve(self.device)
