"""pdctl package `agents` (see DESIGN.md)."""
