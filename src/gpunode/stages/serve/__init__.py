"""Start the SGLang server container on the node and prove it is ready (``gpunode serve``).

``spec.container_spec`` builds the container (pure), ``docker_run.ensure_server`` makes Docker match
it, ``readiness.wait_ready`` watches the startup phases until ``/health_generate`` answers 200, and
``diagnose`` names a failure and its fix. ``command.serve`` ties them together.
"""
