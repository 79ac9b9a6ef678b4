"""The ground floor: the store, canonical table schemas and the pure SLI transforms.

Nothing here talks to the network or imports another package of the project.
"""
