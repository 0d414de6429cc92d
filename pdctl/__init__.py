"""pdctl package `pdctl` (see DESIGN.md)."""
