"""pdctl package `controller` (see DESIGN.md)."""
