"""The router's HTTP server (moving: the request flow now lives in :mod:`router.flow`)."""

from router.flow import Router

__all__ = ["Router"]
