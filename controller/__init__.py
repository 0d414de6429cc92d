"""pdctl package `controller` (see docs/design.md)."""
