"""Cluster mode: replicas that behave as one server by sharing, through Redis, what must be
shared (sequences, the repository's desired state, statistics). Off unless
OPSERVE_CLUSTER_REDIS_URL is set; one process alone needs none of it.

This floor sits above the core (it builds on core's sequences and statistics) and below the
doors; the core never imports it: the app (service/main.py) hands its pieces to the data plane.
"""
