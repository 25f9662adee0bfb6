"""The web console and its JSON API: ``create_app(store)`` gives the FastAPI application."""

from plugtune.web.app import create_app

__all__ = ["create_app"]
