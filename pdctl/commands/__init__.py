"""pdctl command modules: each exposes ``register(app, name, help_text)``."""
