"""The ground floor: facts and types everything stands on; imports nothing of gpunode above it."""
