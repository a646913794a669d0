"""HTTP layer: routers per resource, error handlers, body limit, offline docs."""
