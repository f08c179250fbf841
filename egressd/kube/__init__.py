"""The only layer that talks to the Kubernetes API: config, client, watch, informer, election."""
