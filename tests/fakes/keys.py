"""The kinds of SSH key the tests make with ssh-keygen: every kind Proxmox's ssh-keygen check takes,
at the sizes OpenSSH makes by default or more (tests/unit/conftest.py's key_pairs makes them)."""

KEY_KINDS = {"ed25519": ["-t", "ed25519"], "rsa": ["-t", "rsa", "-b", "3072"], "ecdsa256": ["-t", "ecdsa", "-b", "256"],
             "ecdsa384": ["-t", "ecdsa", "-b", "384"], "ecdsa521": ["-t", "ecdsa", "-b", "521"]}
