"""The Proxy resource as frozen attrs values, and the one cattrs converter (pure, no I/O).

constants  group/version/kind, finalizer, annotation and label names, Phase and Mode
proxy      the frozen attrs classes (Proxy, ProxySpec, ProxyStatus, Condition...)
convert    the one cattrs `converter` (camelCase wire names), `parse_proxy`, `ModelError`
helpers    pure derived values: effective host/port, max leases, health verdict
crd        `load_crd()`: manifests/crd.yaml, packaged through a symlink
"""
