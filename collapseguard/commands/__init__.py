"""One module per CLI command; each is a thin click wrapper over library calls."""
