"""The qwen_image family (diffusers QwenImagePipeline): facts.py, programs.py, host.py and their private modules."""
