"""The router stage: SGLang's router (sglang-router, a Rust binary in a Python wheel) in its own
small, hash-locked image (``image``), as a container (``spec``) on the router machine, with every
host's server as a worker; its API and metrics (``api``); the stage itself (``stage``)."""
