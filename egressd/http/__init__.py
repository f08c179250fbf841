"""The HTTP surfaces: the discovery API and the ops endpoints, served by Hypercorn on trio."""
