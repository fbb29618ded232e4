"""The ltx2 family (diffusers LTX2Pipeline): facts.py, programs.py, host.py and their private modules."""
