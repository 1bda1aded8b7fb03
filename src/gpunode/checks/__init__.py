"""Node state checks, written for pytest-testinfra (one named test per fact, per layer).

Run by `gpunode check host.yml`, or by plain pytest against real nodes with the inventory that
gpunode writes (every expectation travels in its host variables)::

    pytest src/gpunode/checks --hosts='ansible://all' --ansible-inventory=INVENTORY
"""

from pathlib import Path

CHECKS_DIR = Path(__file__).resolve().parent
# In the order a node is built: each layer stands on the ones before it.
LAYERS = ("host", "container", "inside", "image", "p2p", "server")
# The skip reason the checks give for a host they cannot reach; gpunode check reports it once per
# host, as checks not run.
UNREACHABLE = "unreachable"
