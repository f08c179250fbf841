"""Shared pytest set-up: fixtures live in tests/fixtures/, one module per area;
`skip_policy` makes a skip for a missing Squid, tinyproxy, kubectl or curl fail under CI=true."""

pytest_plugins = ["tests.fixtures.apiserver", "tests.fixtures.kube", "tests.skip_policy",
                  "pytester"]
