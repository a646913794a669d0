"""KServe V2 models: operator versions and repository models behind one small interface."""
