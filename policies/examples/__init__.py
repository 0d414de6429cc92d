"""Shipped example policy files (package data)."""
