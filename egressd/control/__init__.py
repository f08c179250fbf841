"""The control loop: work queue, reconciler, status and phase, spec hash, orphan GC."""
