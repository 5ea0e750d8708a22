"""Choosing the verification rule of a test's batch independently of its seeds.

Tests of the standard (Leviathan) rule fix their seeds to draw the same numbers every run;
a row with a seed of its own is coupled by default (specdec.sampling.sampling.SamplingBatch), so
such tests state the rule they test explicitly.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.sampling.sampling import SamplingBatch


def standard_rule(batch: SamplingBatch) -> SamplingBatch:
    """The batch with no coupled row: every sampled row is verified by the standard rule."""
    return dataclasses.replace(batch, coupled=torch.zeros_like(batch.coupled))
