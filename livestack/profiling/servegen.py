"""Profile inputs of a ServeGen folder: rate-weighted PMF mixtures and the aggregate rate curve.

The length mixture follows ``../shared/traces/README.md``: every client's PMFs of each dataset window are weighted
by the client's rate in the 600-s window starting at that dataset window; quantiles are the mixture's inverse CDF.
The short-in/short-out share is computed per PMF pair (input and output independent within one client-window).
The rate curve is the sum of the clients' rates per 600-s window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from env.workloads.traces.servegen import SERVEGEN_WINDOW_S, ServeGenClient
from livestack.profiling.arrivals import rate_curve_stats
from livestack.profiling.distributions import SampleDistribution
from livestack.profiling.profile import ProfileOptions, WorkloadProfile, profile_distributions

__all__ = ["profile_servegen"]


def profile_servegen(
    clients: tuple[ServeGenClient, ...], *, source: str | Path, options: ProfileOptions | None = None
) -> WorkloadProfile:
    """Profile ServeGen clients (see the module docstring for the weighting)."""
    options = options or ProfileOptions()
    in_values, in_weights, out_values, out_weights = [], [], [], []
    joint_short = 0.0
    total_weight = 0.0
    for client in clients:
        for d, start_s in enumerate(client.dataset_start_s.tolist()):
            window = min(int(np.searchsorted(client.window_start_s, start_s)), len(client.rate_rps) - 1)
            weight = float(client.rate_rps[window])
            if weight <= 0:
                continue
            pin, pout = client.input_pmfs[d], client.output_pmfs[d]
            in_values.append(pin.values)
            in_weights.append(pin.probs * weight)
            out_values.append(pout.values)
            out_weights.append(pout.probs * weight)
            short_in = float(pin.probs[pin.values < options.long_context_threshold_tokens].sum())
            short_out = float(pout.probs[pout.values < options.short_output_max_tokens].sum())
            joint_short += weight * short_in * short_out
            total_weight += weight
    input_dist = SampleDistribution.of(np.concatenate(in_values), np.concatenate(in_weights))
    output_dist = SampleDistribution.of(np.concatenate(out_values), np.concatenate(out_weights))
    length = max(len(c.rate_rps) for c in clients)
    aggregate = np.zeros(length)
    for client in clients:
        aggregate[: len(client.rate_rps)] += client.rate_rps
    weighted_cv = np.concatenate([c.iat_cv[c.rate_rps > 0] for c in clients])
    extras = {
        "clients": float(len(clients)),
        "client_window_iat_cv_p50": float(np.percentile(weighted_cv, 50)) if len(weighted_cv) else float("nan"),
        "client_window_iat_cv_p90": float(np.percentile(weighted_cv, 90)) if len(weighted_cv) else float("nan"),
        "aggregate_rate_min_rps": float(aggregate.min()),
        "aggregate_rate_max_rps": float(aggregate.max()),
    }
    notes = [
        "ServeGen holds distributions, not requests: lengths are a rate-weighted PMF mixture over the dataset "
        "windows, the request count is Σ rate × 600 s, and burstiness is per client-window (extras)",
    ]
    return profile_distributions(
        source=str(source),
        source_kind="servegen",
        num_requests=float(aggregate.sum() * SERVEGEN_WINDOW_S),
        input_dist=input_dist,
        output_dist=output_dist,
        short_short_frac=joint_short / total_weight if total_weight > 0 else float("nan"),
        arrivals=rate_curve_stats(aggregate, SERVEGEN_WINDOW_S),
        notes=notes,
        extras=extras,
        options=options,
    )
