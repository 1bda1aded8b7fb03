"""The stages, one package each (host, container, node, image, p2p, serve, smoke, router), over derive."""
