"""The only layer that talks to the Kubernetes API.

config (where and how to connect), client (one httpx.AsyncClient, typed verbs,
retries), errors (typed by status), resources (URLs), watch (event stream),
informer (list+watch cache), election (Lease leader election), events (Event
recorder).
"""
