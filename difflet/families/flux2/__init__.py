"""FLUX.2 [klein]: Flux2KleinPipeline (difflet/families/__init__.py)."""
