"""The benchmark behind `scripts/bench` (issue 12; docs/performance.md says what it measures).

Not part of the product and not imported by it; tests run it only as a smoke
test with tiny sizes (tests/test_bench_smoke.py).
"""
