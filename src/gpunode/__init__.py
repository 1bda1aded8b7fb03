"""gpunode: provision a Proxmox VE host with NVIDIA GPUs to serve a model with SGLang."""

__version__ = "0.1.0"
