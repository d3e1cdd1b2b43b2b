"""Where MODP runs: CUDA with mixed precision when present, else the CPU."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

from dpsql.errors import ConfigurationError


def resolve(device: str) -> torch.device:
    """``auto`` -> CUDA if available, else CPU; other names are checked, not trusted."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as err:
        raise ConfigurationError(f"unknown device {device!r}; use auto, cpu or cuda") from err
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError("device=cuda but no CUDA GPU is visible; use device=auto or cpu")
    if chosen.type not in ("cpu", "cuda"):
        raise ConfigurationError(f"device {device!r} is not supported; use auto, cpu or cuda")
    return chosen


def autocast(device: torch.device) -> AbstractContextManager[object]:
    """Bfloat16 autocast on a CUDA GPU that supports it, else full precision.

    bfloat16 needs no loss scaling; losses and per-example norms are computed
    in float32 regardless.
    """
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A torch generator on ``device`` seeded from the caller's numpy generator."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
