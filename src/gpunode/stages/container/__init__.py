"""The container stage: the GPU LXC container, created and kept through the Proxmox API (proxmoxer):
the client (``client``), the converge logic (``lxc``) and the read-only view ``plan --live`` uses
(``live``)."""
