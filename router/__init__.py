"""pdctl package `router` (see DESIGN.md)."""
