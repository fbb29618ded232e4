"""The flux family (diffusers FluxPipeline): facts.py, programs.py, host.py and their private modules."""
