"""Attribute, input and request models per behaviour-changing operator version."""
