"""Not sglang: a shim whose modules run the test fakes (see tests/fakes/__init__.py)."""
