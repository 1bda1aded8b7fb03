"""Stands in for pypa's get-pip.py where ansible-test cannot download it.

ansible-test's sanity venvs are made without pip and bootstrapped by running get-pip.py, which it
fetches from its own CI file server (ansible_test/_util/target/setup/requirements.py, bootstrap());
this machine reaches PyPI only. This script does what get-pip.py does with the same arguments:
put pip into the running interpreter (here from Python's own ensurepip, no download), then
`pip install` the packages asked for (pip==VERSION, ...) from the package index.
scripts/sanity copies it to the cache path that ansible-test looks for first.
"""

import subprocess
import sys

# get-pip.py's own options that are not pip's.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}

subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
sys.exit(subprocess.run([sys.executable, "-m", "pip", "install", *args]).returncode)
