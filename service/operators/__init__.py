"""The operator layer: registry of operator versions, type checks, and running one node."""
