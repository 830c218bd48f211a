"""The `planet` command line."""
