"""pdctl package `router` (see docs/design.md)."""
