"""pdctl package `env` (see DESIGN.md)."""
