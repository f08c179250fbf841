"""The sandbox: a fake Kubernetes API server, a local kubelet, and the `sandbox` command."""
