"""Attacks by logged-in users on other users and on the cluster, each on real processes."""
