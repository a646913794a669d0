"""HTTP tests of the REST API (a package, so its module names cannot clash with other tests')."""
