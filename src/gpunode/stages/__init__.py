"""The stages, one package each (host, container, node, model, image, p2p, serve, smoke, router), over derive."""
