"""The hunyuan_video family (diffusers HunyuanVideoPipeline): facts.py, programs.py, host.py and their private modules."""
