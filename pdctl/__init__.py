"""pdctl package `pdctl` (see docs/design.md)."""
