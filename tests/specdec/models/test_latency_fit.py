"""Fitting a LatencyModel from timed forwards recovers the latency of a device whose latency is known.

The device measured is an emulated one with a given LatencyModel (sleeping is precise to a
fraction of a millisecond, and the host's own work is small beside the device time even
when another test process shares the CPU, so the terms are chosen tens of milliseconds large)."""

from __future__ import annotations

import pytest

from specdec.models.emulated_device import EmulatedDevice
from specdec.models.emulated_language import SyntheticLanguage
from specdec.models.emulated_model import EmulatedModel
from specdec.models.emulated_profile import LanguageSpec, LatencyModel, load_profile
from specdec.models.latency_fit import Measurements, fit, measure, measurement_points
from specdec.models.model_runner import ModelRunner

KNOWN = LatencyModel(base_ms=20.0, per_row_ms=0.8, knee_tokens=100, per_token_ms=0.2, per_context_token_ms=0.08)


def exact(latency: LatencyModel, max_seq_len: int = 300, rows: int = 16) -> Measurements:
    """What a noiseless device of `latency` would measure at measure()'s points."""
    return Measurements({(r, t, c): latency.forward_ms(r, r * t, r * (c + t))
                         for r, t, c in measurement_points(max_seq_len, rows)})


def test_the_fit_inverts_the_latency_model():
    fitted = fit(exact(KNOWN))
    for field in LatencyModel.model_fields:
        assert getattr(fitted, field) == pytest.approx(getattr(KNOWN, field), rel=1e-2, abs=1e-6), field


def test_a_device_that_never_leaves_the_memory_bound_fits_no_compute_term():
    flat = LatencyModel(base_ms=2.0, knee_tokens=10_000, per_token_ms=0.5, per_context_token_ms=0.001)
    fitted = fit(exact(flat))
    assert fitted.per_token_ms == 0 and fitted.per_row_ms == 0
    assert fitted.base_ms == pytest.approx(2.0) and fitted.per_context_token_ms == pytest.approx(0.001)


@pytest.mark.slow
def test_timed_forwards_of_an_emulated_device_recover_its_latency():
    model = load_profile("h100-llama-8b-1b").target.model_copy(update={"latency": KNOWN})
    emulated = EmulatedModel(SyntheticLanguage(LanguageSpec()), model, "target", EmulatedDevice("known"))
    measured = measure(ModelRunner(emulated, num_slots=16, max_seq_len=300), repeats=5)
    assert set(measured.points) == set(measurement_points(300, 16))
    fitted = fit(measured)  # host overhead and wake-up delays add a little to every point
    assert fitted.base_ms == pytest.approx(KNOWN.base_ms, rel=0.3)
    assert fitted.per_token_ms == pytest.approx(KNOWN.per_token_ms, rel=0.3)
    assert fitted.knee_tokens == pytest.approx(KNOWN.knee_tokens, rel=0.3)
    assert fitted.per_context_token_ms == pytest.approx(KNOWN.per_context_token_ms, rel=0.3)


def test_timed_forwards_compute_every_token_they_time():
    """A repeat is never served from the prefix cache the repeat before filled (its time would shrink)."""
    from specdec.models.latency_fit import time_forward

    model = load_profile("h100-llama-8b-1b").target.model_copy(update={"latency": KNOWN})
    runner = ModelRunner(EmulatedModel(SyntheticLanguage(LanguageSpec()), model, "target", EmulatedDevice("known")),
                         num_slots=2, max_seq_len=64, block_size=4)
    attach, attached = runner.cache.attach_prefix, []
    runner.cache.attach_prefix = lambda *a, **k: attached.append(attach(*a, **k)) or attached[-1]
    time_forward(runner, rows=2, tokens=16, context=8, repeats=2)
    assert attached and sum(attached) == 0
