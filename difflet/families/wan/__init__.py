"""The wan family (diffusers WanPipeline): facts.py, programs.py, host.py and their private modules."""
