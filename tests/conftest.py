"""Shared pytest set-up: fixtures live in tests/fixtures/, one module per area."""

pytest_plugins = ["tests.fixtures.apiserver", "tests.fixtures.kube"]
