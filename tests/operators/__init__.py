"""Tests of the operator layer: schemas, registry, kernels (a package, so its module names cannot
clash with other tests')."""
