"""What gpunode knows: stacks, profiles, bases, ahead-of-time module rules, the GPU hand-off, SGLang's arguments; over the ground floor only."""
