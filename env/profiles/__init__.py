"""Measured operator profiles shipped as package data (one directory per GPU type; see ``README.md`` inside)."""
