"""The model stage: the pinned revision of the weights fetched into the Proxmox host's store (or
found where the host file says they already are) and proven whole before the server starts.

- ``manifest``: the revision's files with sizes and the Hub's hashes, kept beside the weights;
- ``verify``: presence, sizes, sha256, safetensors headers, the index, config.json;
- ``fetch``: what is missing, through huggingface_hub's http_get into partials that a killed run
  resumes (hf_xet where the endpoint offers it), after a disk preflight;
- ``__main__``: the command the stage runs on the machine that holds the weights (the model tools);
- ``stage``: where gpunode runs: the tools' command over SSH, its progress and its record.

Everything but ``stage`` runs with the model tools only (stdlib, huggingface_hub, safetensors).
"""
