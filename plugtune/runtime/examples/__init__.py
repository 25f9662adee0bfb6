"""Example plugins deployed by ``plugtune.runtime.demo`` (no policy gateway needed)."""
