"""Probing every proxy through itself and keeping a verdict per proxy (docs/architecture.md).

`probe` owns one probe through one proxy; `engine` owns scheduling, bounded
concurrency, thresholds and the snapshot. Neither knows about Kubernetes.
"""

from egressd.health.engine import HealthEngine, ProbeFn, Verdict
from egressd.health.probe import BadProbeURL, Prober, ProbeResult, ProbeTarget

__all__ = ["BadProbeURL", "HealthEngine", "ProbeFn", "ProbeResult", "ProbeTarget", "Prober",
           "Verdict"]
