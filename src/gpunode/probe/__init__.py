"""Stand-alone probes (stdlib only) copied into containers and run there."""
