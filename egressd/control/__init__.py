"""The control loop: what feeds the work queue, the queue and its workers, the reconcile
pass (Managed steps, health sync, status), status and phase, spec hash, orphan GC."""
